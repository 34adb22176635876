// The management UI's entry point: the login form, the header and tabs, and a router on
// location.hash that draws one page and refreshes its data every few seconds.

import * as api from './api.js';
import { h, fill, message } from './dom.js';
import * as overview from './overview.js';
import * as sessions from './sessions.js';
import * as exchanges from './exchanges.js';
import * as queues from './queues.js';
import * as admin from './admin.js';

const REFRESH_MS = 5000;
const root = document.getElementById('app');

// [pattern, tab, page]; a pattern's :names become the page's parameters (URI-decoded).
const ROUTES = [
  ['', 'overview', overview.render],
  ['connections', 'connections', sessions.connections],
  ['connections/:name', 'connections', sessions.connection],
  ['channels', 'channels', sessions.channels],
  ['exchanges', 'exchanges', exchanges.exchanges],
  ['exchanges/:vhost/:name', 'exchanges', exchanges.exchange],
  ['queues', 'queues', queues.queues],
  ['queues/:vhost/:name', 'queues', queues.queue],
  ['users', 'admin', admin.users],
  ['vhosts', 'admin', admin.vhosts],
  ['policies', 'admin', admin.policies],
  ['limits', 'admin', admin.limits],
  ['cluster', 'admin', admin.cluster],
];

function tabs() {
  const t = [['overview', 'Overview', '#/'], ['connections', 'Connections', '#/connections'], ['channels', 'Channels', '#/channels'],
    ['exchanges', 'Exchanges', '#/exchanges'], ['queues', 'Queues', '#/queues']];
  const adminPage = admin.ADMIN_PAGES.find(([, , tag]) => api.hasTag(tag));
  if (adminPage) t.push(['admin', 'Admin', `#/${adminPage[0]}`]);
  return t;
}

function match(hash) {
  const path = hash.replace(/^#\/?/, '').replace(/\/$/, '');
  const parts = path === '' ? [] : path.split('/');
  for (const [pattern, tab, page] of ROUTES) {
    const want = pattern === '' ? [] : pattern.split('/');
    if (want.length !== parts.length) continue;
    const params = {};
    let ok = true;
    want.forEach((w, i) => {
      if (w.startsWith(':')) params[w.slice(1)] = decodeURIComponent(parts[i]);
      else if (w !== parts[i]) ok = false;
    });
    if (ok) return { tab, page, params };
  }
  return null;
}

let current = null; // { page, timer, busy }
let layout = null;

function stop() {
  if (current && current.timer) clearInterval(current.timer);
  current = null;
}

function showLogin(note) {
  stop();
  layout = null;
  const out = h('div', { id: 'login-error' }, note ? message('error', note) : null);
  const form = h('form', { id: 'login', onsubmit: async (ev) => {
    ev.preventDefault();
    const user = form.elements.namedItem('username').value;
    const token = api.basicToken(user, form.elements.namedItem('password').value);
    fill(out);
    try {
      const me = await api.get('/api/whoami', { token });
      api.saveLogin(me.name, token, Array.isArray(me.tags) ? me.tags : String(me.tags || '').split(','));
      route();
    } catch (e) {
      fill(out, message('error', e.status === 401 ? (e.reason || 'Login failed') : `Cannot reach the broker: ${e.message}`));
    }
  } },
  h('table', { class: 'form' },
    h('tr', {}, h('th', {}, h('label', { for: 'username' }, 'Username:')), h('td', {}, h('input', { type: 'text', id: 'username', name: 'username', autocomplete: 'username', autofocus: true }))),
    h('tr', {}, h('th', {}, h('label', { for: 'password' }, 'Password:')), h('td', {}, h('input', { type: 'password', id: 'password', name: 'password', autocomplete: 'current-password' })))),
  h('button', { type: 'submit', id: 'login-button' }, 'Login'));
  fill(root, h('div', { class: 'login-page' }, h('div', { class: 'logo' }, h('span', { class: 'mark' }, 'hutch'), h('span', { class: 'sub' }, 'Management')), form, out));
}

function drawLayout() {
  const me = api.login();
  const nav = h('ul', { id: 'tabs' });
  const banner = h('div', { id: 'banner' });
  const main = h('main', { id: 'main' });
  const head = h('header', {},
    h('div', { class: 'logo' }, h('a', { href: '#/' }, h('span', { class: 'mark' }, 'hutch'), h('span', { class: 'sub' }, 'Management'))),
    h('div', { class: 'who' }, 'User ', h('b', { id: 'whoami' }, me.name), ' ',
      h('span', { class: 'dim' }, me.tags.filter(Boolean).join(', ')), ' ',
      h('button', { type: 'button', id: 'logout', class: 'small', onclick: () => { api.logout(); } }, 'Log out')),
    h('nav', {}, nav));
  fill(root, head, banner, main);
  layout = { nav, banner, main };
}

async function refreshPage(page, banner) {
  if (current.busy) return;
  current.busy = true;
  try {
    await page.refresh();
    fill(banner);
  } catch (e) {
    if (api.login()) fill(banner, message('error', e.reason || e.message || String(e)));
  } finally {
    if (current) current.busy = false;
  }
}

function route() {
  if (!api.login()) { showLogin(); return; }
  if (!layout) drawLayout();
  stop();
  const found = match(window.location.hash);
  fill(layout.nav, tabs().map(([id, title, href]) => h('li', {}, h('a', { href, class: found && found.tab === id ? 'selected' : null, 'data-tab': id }, title))));
  if (!found) {
    fill(layout.main, h('h1', {}, 'Not found'), message('error', 'There is no such page.'));
    return;
  }
  const page = found.page(found.params);
  fill(layout.main, page.el);
  current = { page, busy: false, timer: null };
  const me = current;
  refreshPage(page, layout.banner);
  me.timer = setInterval(() => { if (current === me) refreshPage(page, layout.banner); }, REFRESH_MS);
}

api.onLogout(() => showLogin());
window.addEventListener('hashchange', route);
route();
