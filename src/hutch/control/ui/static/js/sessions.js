// Connections and channels: what is open on the cluster, with a form to close a connection.

import * as api from './api.js';
import { h, fill, table, section, num, bytes, rateCell, detailRate, facts, link } from './dom.js';
import { pagedList } from './shared.js';
import { run } from './forms.js';

export function connections() {
  const list = pagedList('connections', '/api/connections', [
    ['Virtual host', (c) => c.vhost, null, 'vhost'],
    ['Name', (c) => link(`#/connections/${api.enc(c.name)}`, c.name), 'name', 'name'],
    ['Node', (c) => c.node, null, 'node'],
    ['User name', (c) => c.user, null, 'user'],
    ['State', (c) => h('span', { class: `status ${c.state === 'running' ? 'green' : 'amber'}` }, c.state), null, 'state'],
    ['SSL / TLS', (c) => (c.ssl ? '●' : '○')],
    ['Protocol', (c) => c.protocol],
    ['Channels', (c) => num(c.channels), 'n', 'channels'],
    ['From client', (c) => bytesRate(c, 'recv_oct'), 'n', 'recv_oct_details.rate'],
    ['To client', (c) => bytesRate(c, 'send_oct'), 'n', 'send_oct_details.rate'],
  ]);
  const el = h('div', { class: 'page' }, h('h1', {}, 'Connections'), section('All connections', list.el));
  return { el, refresh: list.refresh };
}

export function connection({ name }) {
  const info = h('div');
  const chans = h('div');
  const out = h('div');
  const reason = h('input', { type: 'text', name: 'reason', value: 'Closed via management plugin', size: 40 });
  const close = h('form', { class: 'inline', onsubmit: (ev) => {
    ev.preventDefault();
    run(out, () => api.del(`/api/connections/${api.enc(name)}`, { headers: { 'X-Reason': reason.value } }),
      'Connection closed.');
  } }, h('label', {}, 'Reason ', reason), ' ', h('button', { type: 'submit', class: 'danger' }, 'Force Close'));
  const el = h('div', { class: 'page' }, h('h1', {}, 'Connection ', h('b', {}, name)),
    section('Overview', info), section('Channels', chans), section('Close this connection', close, out));
  async function refresh() {
    let c;
    try { c = await api.get(`/api/connections/${api.enc(name)}`); } catch (e) {
      if (e.status === 404) { fill(info, h('p', {}, 'This connection is closed.')); fill(chans); return; }
      throw e;
    }
    fill(info, facts([['Node', c.node], ['User name', c.user], ['Virtual host', c.vhost], ['State', c.state],
      ['Client', `${c.peer_host}:${c.peer_port}`], ['Protocol', c.protocol], ['Authentication', c.auth_mechanism],
      ['Heartbeat', `${c.timeout}s`], ['Frame max', num(c.frame_max)], ['Channel max', num(c.channel_max)],
      c.user_provided_name ? ['Name given by client', c.user_provided_name] : null,
      ['Product', (c.client_properties && c.client_properties.product) || '']]));
    fill(chans, channelTable(await api.get(`/api/connections/${api.enc(name)}/channels`)));
  }
  return { el, refresh };
}

function mode(c) {
  return [c.confirm ? 'C' : '', c.transactional ? 'T' : ''].join('');
}

const CHANNEL_COLUMNS = [
  ['Channel', (c) => c.name, 'name', 'name'],
  ['Node', (c) => c.node, null, 'node'],
  ['Virtual host', (c) => c.vhost, null, 'vhost'],
  ['User name', (c) => c.user, null, 'user'],
  ['Mode', (c) => h('abbr', { title: 'C = confirm, T = transactional' }, mode(c))],
  ['State', (c) => h('span', { class: `status ${c.state === 'running' ? 'green' : 'amber'}` }, c.state)],
  ['Unconfirmed', (c) => num(c.messages_unconfirmed), 'n'],
  ['Prefetch', (c) => (c.global_prefetch_count ? `${c.prefetch_count} / ${c.global_prefetch_count} (global)` : num(c.prefetch_count)), 'n'],
  ['Unacked', (c) => num(c.messages_unacknowledged), 'n', 'messages_unacknowledged'],
  ['Consumers', (c) => num(c.consumer_count), 'n'],
  ['publish', (c) => rateCell(c.message_stats, 'publish'), 'n'],
  ['deliver / get', (c) => rateCell(c.message_stats, 'deliver_get'), 'n'],
  ['ack', (c) => rateCell(c.message_stats, 'ack'), 'n'],
];

function channelTable(chans) { return table(CHANNEL_COLUMNS, chans); }

// A byte rate (recv_oct / send_oct) as B/s, KiB/s...
function bytesRate(stats, key) {
  const r = detailRate(stats, key);
  return r === null ? h('span', { class: 'dim' }, '–') : `${bytes(r)}/s`;
}

export function channels() {
  const list = pagedList('channels', '/api/channels', CHANNEL_COLUMNS);
  const el = h('div', { class: 'page' }, h('h1', {}, 'Channels'), section('All channels', list.el));
  return { el, refresh: list.refresh };
}
