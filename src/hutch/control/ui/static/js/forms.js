// Form helpers: a key = value editor (policy definitions, arguments, headers) with typed
// values and clickable helper keys, as RabbitMQ's forms offer them; and a form runner that
// shows the API's reason when a change is refused.

import { h, fill, message } from './dom.js';

const TYPES = ['String', 'Number', 'Boolean', 'List'];

function convert(key, raw, type) {
  if (type === 'Number') {
    const n = Number(raw);
    if (raw.trim() === '' || Number.isNaN(n)) throw new Error(`${key}: "${raw}" is not a number`);
    return n;
  }
  if (type === 'Boolean') {
    if (raw !== 'true' && raw !== 'false') throw new Error(`${key}: a boolean is true or false`);
    return raw === 'true';
  }
  if (type === 'List') return raw.split(',').map((s) => s.trim()).filter((s) => s !== '');
  return raw;
}

// helpers: [[label, key, type, hint], ...] shown as links under the editor.
export function kvEditor(name, helpers = []) {
  const rows = h('tbody');
  const el = h('div', { class: 'kv', 'data-name': name }, h('table', {}, rows));

  function addRow(key = '', value = '', type = 'String') {
    const k = h('input', { type: 'text', class: 'kv-key', name: `${name}-key`, value: key });
    const v = h('input', { type: 'text', class: 'kv-value', name: `${name}-value`, value });
    const t = h('select', { class: 'kv-type', name: `${name}-type` }, TYPES.map((x) => h('option', { value: x, selected: x === type ? true : null }, x)));
    const tr = h('tr', {}, h('td', {}, k), h('td', {}, '='), h('td', {}, v), h('td', {}, t));
    k.addEventListener('input', () => { if (rows.lastElementChild === tr && k.value) addRow(); });
    rows.append(tr);
    return tr;
  }

  function setKey(key, type) {
    for (const tr of rows.children) {
      const k = tr.querySelector('.kv-key');
      if (k.value === key) { tr.querySelector('.kv-type').value = type; tr.querySelector('.kv-value').focus(); return; }
    }
    let target = [...rows.children].find((tr) => !tr.querySelector('.kv-key').value);
    if (!target) target = addRow();
    target.querySelector('.kv-key').value = key;
    target.querySelector('.kv-type').value = type;
    if (rows.lastElementChild === target) addRow();
    target.querySelector('.kv-value').focus();
  }

  function value() {
    const out = {};
    for (const tr of rows.children) {
      const key = tr.querySelector('.kv-key').value.trim();
      if (!key) continue;
      out[key] = convert(key, tr.querySelector('.kv-value').value, tr.querySelector('.kv-type').value);
    }
    return out;
  }

  function clear() { rows.replaceChildren(); addRow(); }

  // Show an object's keys and values (a policy being edited), each with its type.
  function load(obj) {
    rows.replaceChildren();
    for (const [k, v] of Object.entries(obj)) {
      let type = 'String';
      let text = String(v);
      if (typeof v === 'number') type = 'Number';
      else if (typeof v === 'boolean') type = 'Boolean';
      else if (Array.isArray(v)) { type = 'List'; text = v.join(', '); }
      else if (v !== null && typeof v === 'object') text = JSON.stringify(v);
      addRow(k, text, type);
    }
    addRow();
  }

  addRow();
  if (helpers.length) {
    el.append(h('div', { class: 'helpers' }, helpers.map((group) => h('div', {},
      h('span', { class: 'group' }, `${group[0]}:`),
      group[1].map(([label, key, type, hint]) => [h('a', {
        href: '#', class: 'helper', 'data-key': key, title: hint || key,
        onclick: (ev) => { ev.preventDefault(); setKey(key, type); },
      }, label), ' ']),
    ))));
  }
  return { el, value, setKey, clear, load };
}

// Run an API change from a form: shows "done" or the refusal's reason in `out`.
export async function run(out, work, done) {
  fill(out);
  try {
    const result = await work();
    if (done) fill(out, message('ok', typeof done === 'function' ? done(result) : done));
    return result;
  } catch (e) {
    fill(out, message('error', e.reason || e.message || String(e)));
    return undefined;
  }
}

export function val(form, name) {
  const el = form.elements.namedItem(name);
  return el ? el.value : '';
}
