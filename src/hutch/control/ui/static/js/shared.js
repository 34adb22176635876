// Parts that several pages share: the paged and filtered object lists, the publish-message
// form, the bindings table with unbind buttons, the add-binding form and the virtual host
// selector.

import * as api from './api.js';
import { h, fill, table, select, row } from './dom.js';
import { kvEditor, run } from './forms.js';

const PAGE_SIZE = 100; // rows a list asks the API for at a time, as RabbitMQ's UI

// A list of objects one page at a time (the API's page / page_size / name / use_regex /
// sort parameters), so a broker with many thousands of queues costs the page one page.
export function pagedList(id, path, columns, empty) {
  const st = { page: 1, name: '', regex: false, sort: '', reverse: false };
  const body = h('div', { id });
  const info = h('span', { class: 'pager-info' });
  const pageSel = h('select', { name: `${id}-page`, onchange: () => { st.page = Number(pageSel.value); refresh(); } });
  let typing = null;
  const filter = h('input', { type: 'text', name: `${id}-filter`, size: 20, oninput: () => {
    clearTimeout(typing);
    typing = setTimeout(() => { st.name = filter.value; st.page = 1; refresh().catch(() => {}); }, 300);
  } });
  const regex = h('input', { type: 'checkbox', name: `${id}-regex`, onchange: () => { st.regex = regex.checked; st.page = 1; refresh(); } });
  const bar = h('div', { class: 'pager' }, h('label', {}, 'Page ', pageSel), info, ' ',
    h('label', {}, 'Filter: ', filter), ' ', h('label', {}, regex, ' Regex'));
  const sorting = { onSort: (key) => {
    st.reverse = st.sort === key ? !st.reverse : false;
    st.sort = key;
    refresh();
  } };

  async function refresh() {
    const q = new URLSearchParams({ page: String(st.page), page_size: String(PAGE_SIZE) });
    if (st.name) {
      q.set('name', st.name);
      if (st.regex) q.set('use_regex', 'true');
    }
    if (st.sort) {
      q.set('sort', st.sort);
      q.set('sort_reverse', String(st.reverse));
    }
    let r;
    try {
      r = await api.get(`${path}?${q}`);
    } catch (e) {
      if (e.status === 400 && st.page > 1) { st.page = 1; return refresh(); } // the list shrank
      throw e;
    }
    if (Array.isArray(r)) r = { items: r, page: 1, page_count: 1, filtered_count: r.length, total_count: r.length };
    const pages = Math.max(1, r.page_count);
    fill(pageSel, Array.from({ length: pages }, (_, i) => h('option', { value: i + 1, selected: i + 1 === r.page ? true : null }, i + 1)));
    const items = (n) => `${n} ${n === 1 ? 'item' : 'items'}`;
    fill(info, ` of ${pages} · `, r.filtered_count === r.total_count ? items(r.total_count) : `${r.filtered_count} of ${items(r.total_count)} match`);
    fill(body, table(columns, r.items, empty, { ...sorting, sort: st.sort, reverse: st.reverse }));
    return undefined;
  }
  return { el: h('div', {}, bar, body), refresh };
}

const PROPERTY_HELPERS = [['Properties', [
  ['content_type', 'content_type', 'String'], ['content_encoding', 'content_encoding', 'String'],
  ['priority', 'priority', 'Number'], ['correlation_id', 'correlation_id', 'String'],
  ['reply_to', 'reply_to', 'String'], ['expiration', 'expiration', 'String'],
  ['message_id', 'message_id', 'String'], ['timestamp', 'timestamp', 'Number'],
  ['type', 'type', 'String'], ['user_id', 'user_id', 'String'], ['app_id', 'app_id', 'String'],
]]];

// exchange: the exchange to publish on; fixedKey: a routing key that cannot be changed
// (a queue's page publishes on the default exchange with the queue's name).
export function publishForm(vhost, exchange, fixedKey) {
  const out = h('div', { class: 'publish-result' });
  const key = h('input', { type: 'text', name: 'routing_key', value: fixedKey || '', disabled: fixedKey !== undefined ? true : null });
  const mode = select('delivery_mode', [['1', '1 - Non-persistent'], ['2', '2 - Persistent']], '1');
  const headers = kvEditor('headers');
  const props = kvEditor('props', PROPERTY_HELPERS);
  const payload = h('textarea', { name: 'payload', rows: 4, cols: 60 });
  const form = h('form', { class: 'publish', onsubmit: (ev) => {
    ev.preventDefault();
    run(out, async () => {
      const properties = { ...props.value(), delivery_mode: Number(mode.value) };
      const hdrs = headers.value();
      if (Object.keys(hdrs).length) properties.headers = hdrs;
      const name = exchange === '' ? 'amq.default' : exchange;
      return api.post(`/api/exchanges/${api.enc(vhost)}/${api.enc(name)}/publish`,
        { routing_key: fixedKey !== undefined ? fixedKey : key.value, payload: payload.value, payload_encoding: 'string', properties });
    }, (r) => (r && r.routed ? 'Message published.' : 'Message published, but not routed.'));
  } },
  h('table', { class: 'form' },
    fixedKey !== undefined ? null : row('Routing key:', key),
    row('Delivery mode:', mode),
    row('Headers:', headers.el),
    row('Properties:', props.el),
    row('Payload:', payload)),
  h('button', { type: 'submit', class: 'publish-button' }, 'Publish message'));
  return h('div', {}, form, out);
}

export function bindingPath(b) {
  const src = b.source === '' ? 'amq.default' : b.source;
  const kind = b.destination_type === 'queue' ? 'q' : 'e';
  return `/api/bindings/${api.enc(b.vhost)}/e/${api.enc(src)}/${kind}/${api.enc(b.destination)}/${api.enc(b.properties_key)}`;
}

// side: 'source' lists the destinations (an exchange's page), 'destination' the sources.
export function bindingsTable(bindings, side, onChange, out) {
  return table([
    [side === 'source' ? 'To' : 'From', (b) => {
      if (side === 'source') {
        const hash = `#/${b.destination_type === 'queue' ? 'queues' : 'exchanges'}/${api.enc(b.vhost)}/${api.enc(b.destination)}`;
        return h('a', { href: hash }, b.destination, h('span', { class: 'dim' }, ` (${b.destination_type})`));
      }
      return b.source === '' ? h('i', {}, '(Default exchange binding)') : h('a', { href: `#/exchanges/${api.enc(b.vhost)}/${api.enc(b.source)}` }, b.source);
    }],
    ['Routing key', (b) => b.routing_key],
    ['Arguments', (b) => (b.arguments && Object.keys(b.arguments).length ? JSON.stringify(b.arguments) : '')],
    ['', (b) => (b.source === '' ? '' : h('button', { type: 'button', class: 'small unbind',
      onclick: () => run(out, () => api.del(bindingPath(b)), 'Binding removed.').then(onChange) }, 'Unbind'))],
  ], bindings, '... no bindings ...');
}

// A form that binds `fixed` (an exchange or a queue) to/from another object.
export function bindForm(vhost, { queue, exchange }, onChange) {
  const out = h('div');
  const other = h('input', { type: 'text', name: 'bind-other' });
  const kind = select('bind-kind', [['q', 'To queue'], ['e', 'To exchange']], 'q');
  const key = h('input', { type: 'text', name: 'bind-routing-key' });
  const args = kvEditor('bind-args');
  const form = h('form', { class: 'bind', onsubmit: (ev) => {
    ev.preventDefault();
    run(out, () => {
      let path;
      if (queue !== undefined) path = `/api/bindings/${api.enc(vhost)}/e/${api.enc(other.value)}/q/${api.enc(queue)}`;
      else path = `/api/bindings/${api.enc(vhost)}/e/${api.enc(exchange)}/${kind.value}/${api.enc(other.value)}`;
      return api.post(path, { routing_key: key.value, arguments: args.value() });
    }, 'Binding added.').then(onChange);
  } }, h('h3', {}, queue !== undefined ? 'Add binding to this queue' : 'Add binding from this exchange'),
  h('table', { class: 'form' },
    queue !== undefined ? row('From exchange:', other) : row(kind, other),
    row('Routing key:', key), row('Arguments:', args.el)),
  h('button', { type: 'submit' }, 'Bind'));
  return h('div', {}, form, out);
}

export async function vhostSelect(name = 'vhost') {
  const vhosts = await api.get('/api/vhosts');
  return select(name, vhosts.map((v) => v.name), vhosts.some((v) => v.name === '/') ? '/' : (vhosts[0] || {}).name);
}
