// Queues: the list (type, features, node with mirror / member badges, state, counts, rates)
// with an add form; a queue's page with consumers, bindings, publish, get messages, purge,
// delete, mirror synchronisation and quorum membership.

import * as api from './api.js';
import { h, fill, table, section, num, bytes, rateCell, facts, row, select, message } from './dom.js';
import { kvEditor, run, val } from './forms.js';
import { bindForm, bindingsTable, pagedList, publishForm, vhostSelect } from './shared.js';

const ACK_MODES = [
  ['ack_requeue_true', 'Nack message requeue true'],
  ['ack_requeue_false', 'Automatic ack'],
  ['reject_requeue_true', 'Reject requeue true'],
  ['reject_requeue_false', 'Reject requeue false'],
];

const ARG_HELPERS = [
  ['Add', [
    ['Message TTL', 'x-message-ttl', 'Number'], ['Auto expire', 'x-expires', 'Number'],
    ['Max length', 'x-max-length', 'Number'], ['Max length bytes', 'x-max-length-bytes', 'Number'],
    ['Overflow behaviour', 'x-overflow', 'String', 'drop-head, reject-publish or reject-publish-dlx'],
    ['Dead letter exchange', 'x-dead-letter-exchange', 'String'],
    ['Dead letter routing key', 'x-dead-letter-routing-key', 'String'],
    ['Single active consumer', 'x-single-active-consumer', 'Boolean'],
    ['Maximum priority', 'x-max-priority', 'Number', 'classic queues'],
    ['Lazy mode', 'x-queue-mode', 'String', 'lazy (classic queues)'],
    ['Master locator', 'x-queue-master-locator', 'String', 'min-masters, client-local or random'],
    ['Delivery limit', 'x-delivery-limit', 'Number', 'quorum queues'],
    ['Initial cluster size', 'x-quorum-initial-group-size', 'Number', 'quorum queues'],
    ['Max age', 'x-max-age', 'String', 'streams: 7D, 12h, 30m, 10s'],
    ['Max segment size in bytes', 'x-stream-max-segment-size-bytes', 'Number', 'streams'],
    ['Initial replicas', 'x-initial-cluster-size', 'Number', 'streams'],
  ]],
];

export function queueHash(q) {
  return `#/queues/${api.enc(q.vhost)}/${api.enc(q.name)}`;
}

export function features(q) {
  const f = [];
  if (q.durable) f.push(h('abbr', { title: 'durable' }, 'D'));
  if (q.auto_delete) f.push(h('abbr', { title: 'auto-delete' }, 'AD'));
  if (q.exclusive) f.push(h('abbr', { title: 'exclusive' }, 'Excl'));
  const args = { ...(q.arguments || {}) };
  delete args['x-queue-type'];
  if (Object.keys(args).length) f.push(h('abbr', { title: JSON.stringify(args) }, 'Args'));
  if (q.policy) f.push(h('span', { class: 'policy', title: 'policy' }, q.policy));
  if (q.operator_policy) f.push(h('span', { class: 'policy operator', title: 'operator policy' }, q.operator_policy));
  return h('span', { class: 'features' }, f.map((e) => [e, ' ']));
}

// A quorum queue or a stream: a Raft group with a leader and members, not a leader and mirrors.
const replicated = (q) => q.type === 'quorum' || q.type === 'stream';

// The node column: the queue's leader, then a blue `+N` for synchronised mirrors (or online
// members of a quorum queue or stream) and a red `+N` for unsynchronised ones (or members that
// are down).
export function nodeCell(q) {
  const out = [h('span', {}, replicated(q) ? (q.leader || q.node) : q.node)];
  let good = [];
  let bad = [];
  if (replicated(q) && Array.isArray(q.members)) {
    const others = q.members.filter((m) => m !== (q.leader || q.node));
    const online = new Set(q.online || q.members);
    good = others.filter((m) => online.has(m));
    bad = others.filter((m) => !online.has(m));
  } else if (Array.isArray(q.slave_nodes)) {
    const synced = new Set(q.synchronised_slave_nodes || []);
    good = q.slave_nodes.filter((m) => synced.has(m));
    bad = q.slave_nodes.filter((m) => !synced.has(m));
  }
  const what = replicated(q) ? ['online members', 'members down'] : ['synchronised mirrors', 'unsynchronised mirrors'];
  if (good.length) out.push(' ', h('span', { class: 'mirror synced', title: `${what[0]}: ${good.join(', ')}` }, `+${good.length}`));
  if (bad.length) out.push(' ', h('span', { class: 'mirror unsynced', title: `${what[1]}: ${bad.join(', ')}` }, `+${bad.length}`));
  return h('span', { class: 'node-cell' }, out);
}

function stateCell(q) {
  const s = q.state || 'running';
  return h('span', { class: `status ${s === 'running' ? 'green' : 'amber'}` }, s);
}

export function queues() {
  const list = pagedList('queues', '/api/queues', [
    ['Virtual host', (q) => q.vhost, null, 'vhost'],
    ['Name', (q) => h('a', { href: queueHash(q), class: 'queue-link' }, q.name), 'name', 'name'],
    ['Type', (q) => q.type, null, 'type'],
    ['Features', features],
    ['State', stateCell, null, 'state'],
    ['Node', nodeCell, null, 'node'],
    ['Ready', (q) => num(q.messages_ready), 'n', 'messages_ready'],
    ['Unacked', (q) => num(q.messages_unacknowledged), 'n', 'messages_unacknowledged'],
    ['Total', (q) => num(q.messages), 'n', 'messages'],
    ['incoming', (q) => rateCell(q.message_stats, 'publish'), 'n', 'message_stats.publish_details.rate'],
    ['deliver / get', (q) => rateCell(q.message_stats, 'deliver_get'), 'n', 'message_stats.deliver_get_details.rate'],
    ['ack', (q) => rateCell(q.message_stats, 'ack'), 'n', 'message_stats.ack_details.rate'],
  ]);
  const add = h('div');
  const el = h('div', { class: 'page' }, h('h1', {}, 'Queues'), section('All queues', list.el), section('Add a new queue', add));
  let formShown = false;

  async function showForm() {
    const out = h('div');
    const args = kvEditor('arguments', ARG_HELPERS);
    const nodes = api.hasTag('monitoring') ? (await api.get('/api/nodes')).map((n) => n.name) : [];
    const form = h('form', { id: 'add-queue', onsubmit: (ev) => {
      ev.preventDefault();
      const type = val(form, 'type');
      const path = `/api/queues/${api.enc(val(form, 'vhost'))}/${api.enc(val(form, 'name'))}`;
      run(out, async () => {
        const a = args.value();
        if (type !== 'classic') a['x-queue-type'] = type;
        const body = { durable: val(form, 'durable') === 'true', auto_delete: val(form, 'auto_delete') === 'true', arguments: a };
        if (val(form, 'node')) body.node = val(form, 'node');
        await api.put(path, body);
        return api.get(path);
      }, (q) => (q && q.type !== type
        ? `Queue added, but as a ${q.type} queue: this node's API did not declare a ${type} queue.`
        : 'Queue added.')).then(refresh);
    } }, h('table', { class: 'form' },
      row('Type:', select('type', [['classic', 'Classic'], ['quorum', 'Quorum'], ['stream', 'Stream']], 'classic')),
      row('Virtual host:', await vhostSelect()),
      row('Name:', h('input', { type: 'text', name: 'name', required: true })),
      row('Durability:', select('durable', [['true', 'Durable'], ['false', 'Transient']], 'true')),
      nodes.length > 1 ? row('Node:', select('node', [['', '(where the locator puts it)'], ...nodes.map((n) => [n, n])], '')) : null,
      row('Auto delete:', select('auto_delete', [['false', 'No'], ['true', 'Yes']], 'false')),
      row('Arguments:', args.el)),
    h('button', { type: 'submit' }, 'Add queue'));
    fill(add, form, out);
  }

  async function refresh() {
    await list.refresh();
    if (!formShown) { formShown = true; await showForm(); }
  }
  return { el, refresh };
}

function getForm(vhost, name) {
  const out = h('div', { id: 'get-result' });
  const form = h('form', { id: 'get-messages', onsubmit: (ev) => {
    ev.preventDefault();
    fill(out);
    run(out, () => api.post(`/api/queues/${api.enc(vhost)}/${api.enc(name)}/get`, {
      count: Number(val(form, 'count')) || 1, ackmode: val(form, 'ackmode'), encoding: val(form, 'encoding'), truncate: 50000,
    })).then((msgs) => {
      if (msgs === undefined) return;
      if (msgs.length === 0) { fill(out, message('info', 'Queue is empty')); return; }
      fill(out, msgs.map((m, i) => h('div', { class: 'message' },
        h('h3', {}, `Message ${i + 1}`),
        h('p', {}, `The server reported ${m.message_count} messages remaining.`),
        facts([['Exchange', m.exchange === '' ? '(AMQP default)' : m.exchange], ['Routing Key', m.routing_key],
          ['Redelivered', m.redelivered ? '●' : '○'], ['Properties', JSON.stringify(m.properties || {})],
          ['Payload', h('div', {}, h('span', { class: 'dim' }, `${m.payload_bytes} bytes, encoding: ${m.payload_encoding}`),
            h('pre', { class: 'payload' }, m.payload))]]))));
    });
  } }, h('p', { class: 'warn' }, 'Getting messages from a queue is a destructive action.'),
  h('table', { class: 'form' },
    row('Ack Mode:', select('ackmode', ACK_MODES, 'ack_requeue_true')),
    row('Encoding:', select('encoding', [['auto', 'Auto string / base64'], ['base64', 'base64']], 'auto')),
    row('Messages:', h('input', { type: 'number', name: 'count', value: '1', min: 1, size: 4 }))),
  h('button', { type: 'submit', class: 'get-button' }, 'Get Message(s)'));
  return h('div', {}, form, out);
}

export function queue({ vhost, name }) {
  const path = `/api/queues/${api.enc(vhost)}/${api.enc(name)}`;
  const info = h('div', { id: 'queue-info' });
  const consumers = h('div', { id: 'consumers' });
  const bindings = h('div', { id: 'queue-bindings' });
  const bindOut = h('div');
  const mirrorBox = h('div', { id: 'mirroring' });
  const quorumBox = h('div', { id: 'quorum' });  // members of a quorum queue, replicas of a stream
  const dangerOut = h('div');
  const gone = h('div');
  const el = h('div', { class: 'page' },
    h('h1', {}, 'Queue ', h('b', {}, name), h('span', { class: 'dim' }, ` in virtual host ${vhost}`)), gone,
    section('Overview', info), mirrorBox, quorumBox,
    section('Consumers', consumers),
    section('Bindings', bindings, bindOut, bindForm(vhost, { queue: name }, () => refresh())),
    section('Publish message', h('p', { class: 'dim' }, 'Published on the default exchange with the queue name as routing key.'),
      publishForm(vhost, '', name)),
    section('Get messages', getForm(vhost, name)),
    section('Delete / purge',
      h('button', { type: 'button', class: 'danger', id: 'delete-queue', onclick: () => {
        if (!window.confirm(`Delete queue ${name}?`)) return;
        run(dangerOut, () => api.del(path), null).then((r) => { if (r !== undefined) window.location.hash = '#/queues'; });
      } }, 'Delete Queue'), ' ',
      h('button', { type: 'button', id: 'purge-queue', onclick: () => {
        if (!window.confirm(`Purge all messages of ${name}?`)) return;
        run(dangerOut, () => api.del(`${path}/contents`), 'Queue purged.').then(refresh);
      } }, 'Purge Messages'), dangerOut));
  let quorumShown = false;

  // Built once for a mirrored queue; a refresh redraws only the table, so the answer to a
  // button stays on screen.
  const mirrorTable = h('div');
  const mirrorOut = h('div');
  function mirrorSection(q) {
    if (replicated(q) || !Array.isArray(q.slave_nodes)) { fill(mirrorBox); return; }
    if (!mirrorBox.firstChild) {
      const action = (a, done) => run(mirrorOut, () => api.post(`${path}/actions`, { action: a }), done).then(refresh);
      fill(mirrorBox, section('Mirrors', mirrorTable,
        h('p', {}, h('button', { type: 'button', id: 'sync-queue', onclick: () => action('sync', 'Synchronisation requested.') }, 'Synchronise'), ' ',
          h('button', { type: 'button', id: 'cancel-sync-queue', onclick: () => action('cancel_sync', 'Synchronisation cancelled.') }, 'Cancel synchronisation')),
        mirrorOut));
    }
    const synced = new Set(q.synchronised_slave_nodes || []);
    fill(mirrorTable, table([['Mirror', (m) => m], ['State', (m) => (synced.has(m)
      ? h('span', { class: 'mirror synced' }, 'synchronised') : h('span', { class: 'mirror unsynced' }, 'unsynchronised'))]],
    q.slave_nodes, '... no mirrors ...'));
  }

  // A quorum queue's members (quorum_status, add_member, delete_member) or a stream's replicas
  // (stream_status, add_replica, delete_replica): the same section over each type's routes.
  async function quorumSection(q) {
    if (!replicated(q)) return;
    const stream = q.type === 'stream';
    const status = h('div');
    const out = h('div');
    const admin = api.hasTag('administrator');
    const base = stream ? `/api/hutch/streams/${api.enc(vhost)}/${api.enc(name)}`
      : `/api/hutch/quorum/${api.enc(vhost)}/${api.enc(name)}`;
    const members = stream ? 'replicas' : 'members';
    const columns = stream
      ? [['Replica', (r) => r.node], ['Role', (r) => r.role], ['Epoch', (r) => r.epoch ?? ''],
        ['First offset', (r) => r.first_offset ?? ''], ['Committed offset', (r) => r.committed_offset ?? ''],
        ['Segments', (r) => r.segments ?? ''], ['Readers', (r) => r.readers ?? '']]
      : [['Member', (r) => r.node], ['Raft state', (r) => r.raft_state], ['Membership', (r) => r.membership],
        ['Term', (r) => r.term ?? ''], ['Commit index', (r) => r.commit_index ?? ''], ['Last applied', (r) => r.last_applied ?? '']];
    const show = async () => {
      if (!api.hasTag('monitoring')) return;
      const rows = await api.get(`${base}/status`);
      fill(status, table([
        ...columns,
        admin ? ['', (r) => h('button', { type: 'button', class: 'small', onclick: () => {
          if (!window.confirm(`Remove ${r.node} from the ${members} of ${name}?`)) return;
          run(out, () => api.del(`${base}/${members}/${api.enc(r.node)}`), stream ? 'Replica removed.' : 'Member removed.')
            .then(refresh).then(show);
        } }, 'Remove')] : null,
      ].filter(Boolean), rows));
    };
    let addForm = null;
    if (admin) {
      const nodes = (await api.get('/api/nodes')).map((n) => n.name);
      const pick = select('member-node', nodes, nodes[0]);
      addForm = h('form', { class: 'inline', onsubmit: (ev) => {
        ev.preventDefault();
        run(out, () => api.post(`${base}/${members}`, { node: pick.value }), stream ? 'Replica added.' : 'Member added.')
          .then(refresh).then(show);
      } }, h('label', {}, 'Node ', pick), ' ', h('button', { type: 'submit' }, stream ? 'Add replica' : 'Add member'));
    }
    fill(quorumBox, section(stream ? 'Stream replicas' : 'Quorum members', status, addForm, out));
    await show();
  }

  async function refresh() {
    let q;
    try { q = await api.get(path); } catch (e) {
      if (e.status === 404) { fill(gone, message('error', 'This queue does not exist (any more).')); return; }
      throw e;
    }
    fill(gone);
    const def = q.effective_policy_definition || {};
    fill(info, h('div', { class: 'columns' },
      facts([['Type', q.type], ['Features', features(q)], ['Policy', q.policy || ''],
        q.operator_policy ? ['Operator policy', q.operator_policy] : null,
        Object.keys(def).length ? ['Effective policy definition', h('code', {}, JSON.stringify(def))] : null,
        ['State', stateCell(q)], ['Node', nodeCell(q)],
        replicated(q) ? ['Leader', q.leader || q.node] : null,
        replicated(q) ? ['Members', (q.members || []).join(', ')] : null,
        replicated(q) && q.online ? ['Online', q.online.join(', ')] : null,
        q.type === 'stream' && q.committed_offset != null ? ['Committed offset', num(q.committed_offset)] : null,
        Array.isArray(q.slave_nodes) ? ['Mirrors', q.slave_nodes.join(', ')] : null,
        Array.isArray(q.slave_nodes) ? ['Synchronised mirrors', (q.synchronised_slave_nodes || []).join(', ')] : null,
        ['Consumers', num(q.consumers)], ['Consumer capacity', `${Math.round((q.consumer_capacity || 0) * 100)}%`],
        ['Arguments', Object.keys(q.arguments || {}).length ? JSON.stringify(q.arguments) : '']]),
      facts([['Ready', h('span', { id: 'q-ready' }, num(q.messages_ready))],
        ['Unacked', h('span', { id: 'q-unacked' }, num(q.messages_unacknowledged))],
        ['Total', h('span', { id: 'q-total' }, num(q.messages))],
        ['Message body bytes', bytes(q.message_bytes)],
        ['incoming', rateCell(q.message_stats, 'publish')], ['deliver / get', rateCell(q.message_stats, 'deliver_get')],
        ['ack', rateCell(q.message_stats, 'ack')]])));
    mirrorSection(q);
    if (!quorumShown) { quorumShown = true; await quorumSection(q); }
    fill(consumers, table([
      ['Channel', (c) => (c.channel_details && c.channel_details.name) || (c.channel_details && c.channel_details.node) || ''],
      ['Consumer tag', (c) => c.consumer_tag], ['Ack required', (c) => (c.ack_required ? '●' : '○')],
      ['Exclusive', (c) => (c.exclusive ? '●' : '○')], ['Prefetch count', (c) => num(c.prefetch_count)],
      ['Active', (c) => (c.active ? '●' : '○')], ['Activity status', (c) => c.activity_status || ''],
      ['Arguments', (c) => (c.arguments && Object.keys(c.arguments).length ? JSON.stringify(c.arguments) : '')],
    ], q.consumer_details || [], '... no consumers ...'));
    fill(bindings, bindingsTable(await api.get(`${path}/bindings`), 'destination', refresh, bindOut));
  }
  return { el, refresh };
}
