// Exchanges: the list with an add form; an exchange's page with its bindings both ways,
// a bind form, the publish-message form and delete.

import * as api from './api.js';
import { h, fill, section, rateCell, facts, row, select } from './dom.js';
import { kvEditor, run, val } from './forms.js';
import { bindForm, bindingsTable, pagedList, publishForm, vhostSelect } from './shared.js';

function features(x) {
  const f = [];
  if (x.durable) f.push(h('abbr', { title: 'durable' }, 'D'));
  if (x.auto_delete) f.push(h('abbr', { title: 'auto-delete' }, 'AD'));
  if (x.internal) f.push(h('abbr', { title: 'internal' }, 'I'));
  if (x.arguments && Object.keys(x.arguments).length) f.push(h('abbr', { title: JSON.stringify(x.arguments) }, 'Args'));
  if (x.policy) f.push(h('span', { class: 'policy' }, x.policy));
  return h('span', { class: 'features' }, f.map((e) => [e, ' ']));
}

function exchangeHash(x) {
  return `#/exchanges/${api.enc(x.vhost)}/${api.enc(x.name === '' ? 'amq.default' : x.name)}`;
}

export function exchanges() {
  const list = pagedList('exchanges', '/api/exchanges', [
    ['Virtual host', (x) => x.vhost, null, 'vhost'],
    ['Name', (x) => h('a', { href: exchangeHash(x) }, x.name === '' ? '(AMQP default)' : x.name), 'name', 'name'],
    ['Type', (x) => x.type, null, 'type'],
    ['Features', features],
    ['Message rate in', (x) => rateCell(x.message_stats, 'publish_in'), 'n', 'message_stats.publish_in_details.rate'],
    ['Message rate out', (x) => rateCell(x.message_stats, 'publish_out'), 'n', 'message_stats.publish_out_details.rate'],
  ]);
  const add = h('div');
  const el = h('div', { class: 'page' }, h('h1', {}, 'Exchanges'), section('All exchanges', list.el), section('Add a new exchange', add));
  let formShown = false;

  async function showForm() {
    const out = h('div');
    const args = kvEditor('arguments', [['Add', [['Alternate exchange', 'alternate-exchange', 'String']]]]);
    const form = h('form', { id: 'add-exchange', onsubmit: (ev) => {
      ev.preventDefault();
      run(out, () => api.put(`/api/exchanges/${api.enc(val(form, 'vhost'))}/${api.enc(val(form, 'name'))}`, {
        type: val(form, 'type'), durable: val(form, 'durable') === 'true', auto_delete: val(form, 'auto_delete') === 'true',
        internal: val(form, 'internal') === 'true', arguments: args.value(),
      }), 'Exchange added.').then(refresh);
    } }, h('table', { class: 'form' },
      row('Virtual host:', await vhostSelect()),
      row('Name:', h('input', { type: 'text', name: 'name', required: true })),
      row('Type:', select('type', ['direct', 'fanout', 'headers', 'topic'], 'direct')),
      row('Durability:', select('durable', [['true', 'Durable'], ['false', 'Transient']], 'true')),
      row('Auto delete:', select('auto_delete', [['false', 'No'], ['true', 'Yes']], 'false')),
      row('Internal:', select('internal', [['false', 'No'], ['true', 'Yes']], 'false')),
      row('Arguments:', args.el)),
    h('button', { type: 'submit' }, 'Add exchange'));
    fill(add, form, out);
  }

  async function refresh() {
    await list.refresh();
    if (!formShown) { formShown = true; await showForm(); }
  }
  return { el, refresh };
}

export function exchange({ vhost, name }) {
  const path = `/api/exchanges/${api.enc(vhost)}/${api.enc(name)}`;
  const info = h('div');
  const src = h('div', { id: 'bindings-source' });
  const dst = h('div', { id: 'bindings-destination' });
  const bindOut = h('div');
  const delOut = h('div');
  const isDefault = name === 'amq.default';
  const el = h('div', { class: 'page' },
    h('h1', {}, 'Exchange ', h('b', {}, isDefault ? '(AMQP default)' : name), h('span', { class: 'dim' }, ` in virtual host ${vhost}`)),
    section('Overview', info),
    section('Bindings', h('h3', {}, 'This exchange → '), src, h('h3', {}, '→ This exchange'), dst, bindOut,
      isDefault ? null : bindForm(vhost, { exchange: name }, () => refresh())),
    section('Publish message', publishForm(vhost, name)),
    isDefault ? null : section('Delete this exchange', h('button', { type: 'button', class: 'danger', id: 'delete-exchange', onclick: () => {
      if (!window.confirm(`Delete exchange ${name}?`)) return;
      run(delOut, () => api.del(path), null).then((r) => { if (r !== undefined) window.location.hash = '#/exchanges'; });
    } }, 'Delete'), delOut));

  async function refresh() {
    const x = await api.get(path);
    fill(info, facts([['Type', x.type], ['Features', features(x)], ['Policy', x.policy || ''],
      ['Arguments', x.arguments && Object.keys(x.arguments).length ? JSON.stringify(x.arguments) : '']]));
    const [s, d] = await Promise.all([api.get(`${path}/bindings/source`), api.get(`${path}/bindings/destination`)]);
    fill(src, isDefault ? h('p', { class: 'dim' }, 'The default exchange is bound to every queue by its name.') : bindingsTable(s, 'source', refresh, bindOut));
    fill(dst, bindingsTable(d, 'destination', refresh, bindOut));
  }
  return { el, refresh };
}

export { features };
