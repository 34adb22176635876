// Overview: queued messages and message rates over the last ten minutes, object totals, the
// cluster's nodes, this node's listeners, and export/import of definitions.

import * as api from './api.js';
import { h, fill, table, section, num, bytes, uptime, select } from './dom.js';
import { lineChart, samplePoints, ratePoints } from './charts.js';
import { run } from './forms.js';

const OVERVIEW = '/api/overview?lengths_age=600&lengths_incr=5&msg_rates_age=600&msg_rates_incr=5';
const LOCAL_POINTS_MAX = 121; // ten minutes at one sample per 5 s
const localQueued = []; // samples this page took itself when the API gives no history

const QUEUED = [
  ['Ready', 'messages_ready', '#edc240'],
  ['Unacked', 'messages_unacknowledged', '#afd8f8'],
  ['Total', 'messages', '#cb4b4b'],
];
const RATES = [
  ['Publish', 'publish', '#edc240'],
  ['Publisher confirm', 'confirm', '#afd8f8'],
  ['Deliver / get', 'deliver_get', '#cb4b4b'],
  ['Redelivered', 'redeliver', '#4da74d'],
  ['Consumer ack', 'ack', '#9440ed'],
  ['Unroutable (return)', 'return_unroutable', '#666'],
  ['Unroutable (drop)', 'drop_unroutable', '#b33'],
];

function queuedChart(totals) {
  const series = QUEUED.map(([label, key, color]) => ({ label, color, points: samplePoints(totals[`${key}_details`]) }));
  if (series.every((x) => x.points && x.points.length)) {
    // The samples are taken every few seconds; the totals are of now: end each line there.
    const now = Date.now();
    QUEUED.forEach(([, key], i) => {
      const newest = Math.max(...series[i].points.map((p) => p[0]));
      if (now > newest && typeof totals[key] === 'number') series[i].points.push([now, totals[key]]);
    });
    return [lineChart(series), null];
  }
  const now = Date.now();
  localQueued.push([now, totals]);
  while (localQueued.length > LOCAL_POINTS_MAX) localQueued.shift();
  const local = QUEUED.map(([label, key, color]) => ({ label, color, points: localQueued.map(([t, q]) => [t, q[key] || 0]) }));
  return [lineChart(local), h('p', { class: 'note' }, 'The API keeps no history of queue lengths: sampled by this page while it is open.')];
}

function ratesChart(stats) {
  const series = [];
  for (const [label, key, color] of RATES) {
    const d = stats && stats[`${key}_details`];
    if (!d) continue;
    let points = ratePoints(d);
    if (!points || points.length === 0) points = typeof d.rate === 'number' ? [[Date.now(), d.rate]] : [];
    series.push({ label, color, points, current: typeof d.rate === 'number' ? d.rate : undefined });
  }
  if (series.length === 0) return h('p', { class: 'no-data' }, 'no rate data');
  return lineChart(series, { unit: '/s' });
}

function metadataRole(node, cluster) {
  if (node.metadata_role || node.raft_role) return node.metadata_role || node.raft_role;
  if (!cluster || !cluster.leader) return '';
  return cluster.leader === node.name ? 'leader' : 'follower';
}

// A used / limit bar; `show` formats the numbers (a count or bytes).
function gauge(used, limit, alarm, show = num) {
  if (used === undefined || used === null) return h('span', { class: 'dim' }, '?');
  const pct = limit ? Math.min(100, (used / limit) * 100) : 0;
  return h('div', { class: `gauge${alarm ? ' alarm' : ''}`, title: limit ? `${pct.toFixed(1)}% of the limit` : null },
    h('div', { class: 'bar', style: `width:${pct.toFixed(0)}%` }),
    h('span', {}, limit ? `${show(used)} / ${show(limit)}` : show(used)));
}

export function nodesTable(nodes, cluster) {
  return table([
    ['Name', (n) => h('span', { class: 'node-name' }, n.name)],
    ['File descriptors', (n) => gauge(n.fd_used, n.fd_total)],
    ['Socket descriptors', (n) => gauge(n.sockets_used, n.sockets_total)],
    ['Memory', (n) => gauge(n.mem_used, n.mem_limit, n.mem_alarm, bytes)],
    ['Disk space (free)', (n) => (n.disk_free === undefined ? h('span', { class: 'dim' }, '?')
      : h('span', { class: n.disk_free_alarm ? 'red' : '' }, `${bytes(n.disk_free)}`, h('span', { class: 'dim' }, ` (limit ${bytes(n.disk_free_limit)})`)))],
    ['Uptime', (n) => uptime(n.uptime)],
    ['Metadata (Raft)', (n) => metadataRole(n, cluster)],
    ['State', (n) => {
      if (!n.running) return h('span', { class: 'status red' }, 'not running');
      const alarms = [n.mem_alarm && 'memory alarm', n.disk_free_alarm && 'disk alarm'].filter(Boolean);
      if (n.partitions && n.partitions.length) alarms.push(`partitioned from ${n.partitions.join(', ')}`);
      return alarms.length ? h('span', { class: 'status red' }, alarms.join(', ')) : h('span', { class: 'status green' }, 'running');
    }],
  ], nodes);
}

function totals(o) {
  const t = o.object_totals || {};
  const q = o.queue_totals || {};
  return h('div', { class: 'totals' },
    [['Ready', q.messages_ready], ['Unacked', q.messages_unacknowledged], ['Total', q.messages]].map(([k, v]) =>
      h('div', { class: 'total' }, h('span', { class: 'label' }, k), h('span', { class: 'value', 'data-total': k.toLowerCase() }, num(v)))),
    [['Connections', t.connections, '#/connections'], ['Channels', t.channels, '#/channels'], ['Exchanges', t.exchanges, '#/exchanges'],
      ['Queues', t.queues, '#/queues'], ['Consumers', t.consumers, null]].map(([k, v, href]) =>
      h('div', { class: 'total' }, h('span', { class: 'label' }, href ? h('a', { href }, k) : k), h('span', { class: 'value' }, num(v)))));
}

function definitionsBox(vhosts) {
  const out = h('div');
  const which = select('vhost', [['', 'All'], ...vhosts.map((v) => [v, v])], '');
  const download = h('button', { type: 'button', id: 'export-definitions', onclick: () => run(out, async () => {
    const path = which.value ? `/api/definitions/${api.enc(which.value)}` : '/api/definitions';
    const doc = await api.get(path);
    const blob = new Blob([JSON.stringify(doc, null, 2)], { type: 'application/json' });
    const a = h('a', { href: URL.createObjectURL(blob), download: `hutch-definitions${which.value ? `-${which.value.replace(/[^\w.-]/g, '_')}` : ''}.json` });
    document.body.append(a); a.click(); a.remove();
  }, 'Definitions downloaded.') }, 'Download broker definitions');
  const file = h('input', { type: 'file', name: 'file', accept: '.json,application/json' });
  const upload = h('button', { type: 'button', id: 'import-definitions', onclick: () => run(out, async () => {
    if (!file.files.length) throw new Error('Choose a definitions file first.');
    let doc;
    try { doc = JSON.parse(await file.files[0].text()); } catch (_) { throw new Error('That file is not JSON.'); }
    const path = which.value ? `/api/definitions/${api.enc(which.value)}` : '/api/definitions';
    return api.post(path, doc);
  }, 'Definitions imported.') }, 'Upload broker definitions');
  return section('Export / import definitions',
    h('table', { class: 'form' },
      h('tr', {}, h('th', {}, 'Virtual host'), h('td', {}, which)),
      h('tr', {}, h('th', {}, 'Export'), h('td', {}, download)),
      h('tr', {}, h('th', {}, 'Import'), h('td', {}, file, ' ', upload))),
    out);
}

export function render() {
  const head = h('div');
  const charts = h('div', { class: 'charts' });
  const nodes = h('div', { id: 'nodes' });
  const listeners = h('div', { id: 'listeners' });
  const defs = h('div');
  const el = h('div', { class: 'page overview' }, h('h1', {}, 'Overview'), head,
    section('Totals', charts), hasNodes() ? section('Nodes', nodes) : null, section('Ports and contexts', listeners), defs);
  let defsShown = false;

  async function refresh() {
    const o = await api.get(OVERVIEW);
    fill(head, h('p', { class: 'cluster' }, 'Cluster ', h('strong', { id: 'cluster-name' }, o.cluster_name),
      ` · ${o.product_name} ${o.product_version} (RabbitMQ ${o.rabbitmq_version} API) · this page is served by `, h('strong', {}, o.node)));
    const [queued, note] = queuedChart(o.queue_totals || {});
    fill(charts,
      h('div', { class: 'chart-cell' }, h('h3', {}, 'Queued messages ', h('span', { class: 'dim' }, 'last ten minutes')), queued, note),
      totals(o),
      h('div', { class: 'chart-cell' }, h('h3', {}, 'Message rates ', h('span', { class: 'dim' }, 'last ten minutes')), ratesChart(o.message_stats)));
    if (hasNodes()) {
      const [ns, cl] = await Promise.all([api.get('/api/nodes'), api.optional('/api/hutch/cluster')]);
      fill(nodes, nodesTable(ns, cl));
    }
    fill(listeners, table([
      ['Protocol', (l) => l.protocol], ['Bound to', (l) => l.ip_address], ['Port', (l) => l.port], ['Node', (l) => l.node],
    ], o.listeners || []));
    if (!defsShown && api.hasTag('administrator')) {
      defsShown = true;
      const vhosts = await api.get('/api/vhosts');
      fill(defs, definitionsBox(vhosts.map((v) => v.name)));
    }
  }
  return { el, refresh };
}

function hasNodes() { return api.hasTag('monitoring'); }
