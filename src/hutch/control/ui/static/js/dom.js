// Small DOM and formatting helpers shared by every page. Text is always inserted as text
// nodes (never as HTML), so names coming from the broker cannot inject markup.

export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k.startsWith('on')) el.addEventListener(k.slice(2), v);
    else if (k === 'class') el.className = v;
    else if (k === 'value') el.value = v;
    else if (k === 'checked') el.checked = !!v;
    else el.setAttribute(k, v === true ? '' : v);
  }
  for (const c of children.flat(Infinity)) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : String(c));
  }
  return el;
}

export function fill(el, ...children) {
  el.replaceChildren();
  for (const c of children.flat(Infinity)) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : String(c));
  }
  return el;
}

// A table: columns are [title, row => cell content, optional class, optional sort key]; rows
// an array. With `sorting` ({sort, reverse, onSort}) a column with a sort key has a clickable
// heading.
export function table(columns, rows, empty = '... no items ...', sorting = null) {
  const heading = (title, key) => {
    if (!sorting || !key) return title;
    const mark = sorting.sort === key ? (sorting.reverse ? ' ▼' : ' ▲') : '';
    return h('a', { href: '#', class: 'sort', 'data-sort': key, onclick: (ev) => { ev.preventDefault(); sorting.onSort(key); } }, title, mark);
  };
  const head = h('tr', {}, columns.map(([title, , cls, key]) => h('th', { class: cls }, heading(title, key))));
  if (!rows || rows.length === 0) {
    return h('table', { class: 'list' }, h('thead', {}, head),
      h('tbody', {}, h('tr', {}, h('td', { colspan: columns.length, class: 'empty' }, empty))));
  }
  const body = rows.map((row, i) => h('tr', { class: i % 2 ? 'alt' : null },
    columns.map(([, cell, cls]) => h('td', { class: cls }, cell(row)))));
  return h('table', { class: 'list' }, h('thead', {}, head), h('tbody', {}, body));
}

// A two-column table of facts: [[label, value], ...].
export function facts(rows) {
  return h('table', { class: 'facts' }, rows.filter(Boolean).map(([k, v]) => h('tr', {}, h('th', {}, k), h('td', {}, v))));
}

export function section(title, ...content) {
  return h('section', { class: 'box' }, h('h2', {}, title), ...content);
}

export function message(kind, text) {
  return h('div', { class: `msg ${kind}`, role: kind === 'error' ? 'alert' : 'status' }, text);
}

export function link(hash, text, attrs = {}) {
  return h('a', { href: hash, ...attrs }, text);
}

export function num(n) {
  if (n === null || n === undefined || Number.isNaN(n)) return '';
  return Number(n).toLocaleString('en-US');
}

export function bytes(n) {
  if (n === null || n === undefined) return '';
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let v = Number(n);
  let i = 0;
  while (Math.abs(v) >= 1024 && i < units.length - 1) { v /= 1024; i += 1; }
  return `${i === 0 ? v : v.toFixed(1)} ${units[i]}`;
}

export function rate(n) {
  if (n === null || n === undefined) return '';
  return `${Number(n).toFixed(Math.abs(n) >= 10 ? 0 : 1)}/s`;
}

export function uptime(ms) {
  if (!ms && ms !== 0) return '';
  let s = Math.floor(ms / 1000);
  const d = Math.floor(s / 86400); s -= d * 86400;
  const hr = Math.floor(s / 3600); s -= hr * 3600;
  const m = Math.floor(s / 60); s -= m * 60;
  if (d) return `${d}d ${hr}h`;
  if (hr) return `${hr}h ${m}m`;
  return `${m}m ${s}s`;
}

// "A rate" from a RabbitMQ-style *_details object, or null when the API gave none.
export function detailRate(stats, key) {
  const d = stats && stats[`${key}_details`];
  return d && typeof d.rate === 'number' ? d.rate : null;
}

export function rateCell(stats, key) {
  const r = detailRate(stats, key);
  return r === null ? h('span', { class: 'dim' }, '–') : rate(r);
}

// A labelled form row.
export function row(label, control, help) {
  return h('tr', {}, h('th', {}, h('label', {}, label)), h('td', {}, control, help ? h('span', { class: 'help' }, help) : null));
}

export function select(name, options, value) {
  return h('select', { name }, options.map((o) => {
    const [v, text] = Array.isArray(o) ? o : [o, o];
    return h('option', { value: v, selected: v === value ? true : null }, text);
  }));
}
