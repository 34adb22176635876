// Admin: users and permissions, virtual hosts, policies (and operator policies when the
// node serves them), limits (when served), the cluster's nodes. Each page offers only what
// the logged-in user's tags allow; the API checks again.

import * as api from './api.js';
import { h, fill, table, section, num, row, select, message } from './dom.js';
import { kvEditor, run, val } from './forms.js';
import { nodesTable } from './overview.js';
import { vhostSelect } from './shared.js';

export const ADMIN_PAGES = [
  ['users', 'Users', 'administrator'],
  ['vhosts', 'Virtual Hosts', 'administrator'],
  ['policies', 'Policies', 'policymaker'],
  ['limits', 'Limits', 'administrator'],
  ['cluster', 'Cluster', 'administrator'],
];

function adminFrame(current, ...content) {
  const menu = h('ul', { class: 'submenu' }, ADMIN_PAGES.filter(([, , tag]) => api.hasTag(tag)).map(([id, title]) =>
    h('li', {}, h('a', { href: `#/${id}`, class: id === current ? 'selected' : null }, title))));
  return h('div', { class: 'page admin' }, h('div', { class: 'with-menu' }, h('nav', {}, menu), h('div', { class: 'content' }, ...content)));
}

function refused(tag) {
  return message('error', `This page needs the ${tag} tag; the user you are logged in as does not have it.`);
}

function gated(current, tag, build) {
  if (!api.hasTag(tag)) return { el: adminFrame(current, h('h1', {}, 'Admin'), refused(tag)), refresh: async () => {} };
  return build();
}

const TAG_HELPERS = [['Set', [['Admin', 'administrator'], ['Monitoring', 'monitoring'], ['Policymaker', 'policymaker'],
  ['Management', 'management'], ['None', '']]]];

// ------------------------------------------------------------------------------------- users

export function users() {
  return gated('users', 'administrator', () => {
    const list = h('div', { id: 'users' });
    const perms = h('div', { id: 'permissions' });
    const out = h('div');
    const addOut = h('div');
    const permOut = h('div');
    const tags = h('input', { type: 'text', name: 'tags', size: 30 });
    const helpers = h('span', { class: 'helpers' }, TAG_HELPERS[0][1].map(([label, tag]) => h('a', { href: '#', class: 'helper', onclick: (ev) => {
      ev.preventDefault();
      if (!tag) { tags.value = ''; return; }
      const have = tags.value.split(',').map((s) => s.trim()).filter(Boolean);
      if (!have.includes(tag)) have.push(tag);
      tags.value = have.join(', ');
    } }, label)).map((a) => [a, ' ']));
    const addForm = h('form', { id: 'add-user', onsubmit: (ev) => {
      ev.preventDefault();
      run(addOut, () => {
        if (val(addForm, 'password') !== val(addForm, 'password2')) throw new Error('The passwords do not match.');
        return api.put(`/api/users/${api.enc(val(addForm, 'username'))}`, { password: val(addForm, 'password'), tags: tags.value.replace(/\s+/g, '') });
      }, 'User added.').then(refresh);
    } }, h('table', { class: 'form' },
      row('Username:', h('input', { type: 'text', name: 'username', required: true })),
      row('Password:', h('input', { type: 'password', name: 'password', autocomplete: 'new-password' })),
      row('(confirm)', h('input', { type: 'password', name: 'password2', autocomplete: 'new-password' })),
      row('Tags:', tags, helpers)),
    h('button', { type: 'submit' }, 'Add user'));
    const permForm = h('form', { id: 'set-permission' });
    const el = adminFrame('users', h('h1', {}, 'Users'), section('All users', list, out),
      section('Add a user', addForm, addOut), section('Permissions', perms, permForm, permOut));
    let permFormShown = false;
    let userPick = null;

    async function showPermForm(userNames) {
      userPick = select('user', userNames, userNames[0]);
      permForm.onsubmit = (ev) => {
        ev.preventDefault();
        run(permOut, () => api.put(`/api/permissions/${api.enc(val(permForm, 'vhost'))}/${api.enc(val(permForm, 'user'))}`,
          { configure: val(permForm, 'configure'), write: val(permForm, 'write'), read: val(permForm, 'read') }), 'Permission set.').then(refresh);
      };
      fill(permForm, h('table', { class: 'form' },
        row('User:', userPick),
        row('Virtual host:', await vhostSelect()),
        row('Configure regexp:', h('input', { type: 'text', name: 'configure', value: '.*' })),
        row('Write regexp:', h('input', { type: 'text', name: 'write', value: '.*' })),
        row('Read regexp:', h('input', { type: 'text', name: 'read', value: '.*' }))),
      h('button', { type: 'submit' }, 'Set permission'));
    }

    async function refresh() {
      const [us, ps] = await Promise.all([api.get('/api/users'), api.get('/api/permissions')]);
      const access = {};
      for (const p of ps) (access[p.user] = access[p.user] || []).push(p.vhost);
      fill(list, table([
        ['Name', (u) => u.name, 'name'],
        ['Tags', (u) => (Array.isArray(u.tags) ? u.tags : String(u.tags || '').split(',')).filter(Boolean).join(', ')],
        ['Can access virtual hosts', (u) => (access[u.name] ? access[u.name].join(', ') : h('span', { class: 'dim' }, 'No access'))],
        ['Has password', (u) => (u.password_hash ? '●' : '○')],
        ['', (u) => h('button', { type: 'button', class: 'small danger', onclick: () => {
          if (!window.confirm(`Delete user ${u.name}?`)) return;
          run(out, () => api.del(`/api/users/${api.enc(u.name)}`), `User ${u.name} deleted.`).then(refresh);
        } }, 'Delete')],
      ], us));
      fill(perms, table([
        ['User', (p) => p.user], ['Virtual host', (p) => p.vhost], ['Configure regexp', (p) => p.configure],
        ['Write regexp', (p) => p.write], ['Read regexp', (p) => p.read],
        ['', (p) => h('button', { type: 'button', class: 'small', onclick: () =>
          run(permOut, () => api.del(`/api/permissions/${api.enc(p.vhost)}/${api.enc(p.user)}`), 'Permission cleared.').then(refresh) }, 'Clear')],
      ], ps));
      const names = us.map((u) => u.name);
      if (!permFormShown) { permFormShown = true; await showPermForm(names); } else if (userPick) {
        const chosen = userPick.value;
        fill(userPick, names.map((n) => h('option', { value: n, selected: n === chosen ? true : null }, n)));
      }
    }
    return { el, refresh };
  });
}

// ------------------------------------------------------------------------------------ vhosts

export function vhosts() {
  return gated('vhosts', 'administrator', () => {
    const list = h('div', { id: 'vhosts' });
    const out = h('div');
    const addOut = h('div');
    const form = h('form', { id: 'add-vhost', onsubmit: (ev) => {
      ev.preventDefault();
      run(addOut, () => api.put(`/api/vhosts/${api.enc(val(form, 'name'))}`, { description: val(form, 'description'), tags: val(form, 'tags') }),
        'Virtual host added.').then(refresh);
    } }, h('table', { class: 'form' },
      row('Name:', h('input', { type: 'text', name: 'name', required: true })),
      row('Description:', h('input', { type: 'text', name: 'description' })),
      row('Tags:', h('input', { type: 'text', name: 'tags' }))),
    h('button', { type: 'submit' }, 'Add virtual host'));
    const el = adminFrame('vhosts', h('h1', {}, 'Virtual Hosts'), section('All virtual hosts', list, out), section('Add a new virtual host', form, addOut));
    async function refresh() {
      fill(list, table([
        ['Name', (v) => v.name, 'name'], ['Description', (v) => v.description || ''],
        ['Tags', (v) => (Array.isArray(v.tags) ? v.tags.join(', ') : v.tags || '')],
        ['Ready', (v) => num(v.messages_ready), 'n'], ['Unacked', (v) => num(v.messages_unacknowledged), 'n'], ['Total', (v) => num(v.messages), 'n'],
        ['', (v) => h('button', { type: 'button', class: 'small danger', onclick: () => {
          if (!window.confirm(`Delete virtual host ${v.name} and everything in it?`)) return;
          run(out, () => api.del(`/api/vhosts/${api.enc(v.name)}`), `Virtual host ${v.name} deleted.`).then(refresh);
        } }, 'Delete')],
      ], await api.get('/api/vhosts')));
    }
    return { el, refresh };
  });
}

// ---------------------------------------------------------------------------------- policies

const POLICY_HELPERS = [
  ['Queues [All types]', [
    ['Max length', 'max-length', 'Number'], ['Max length bytes', 'max-length-bytes', 'Number'],
    ['Overflow behaviour', 'overflow', 'String', 'drop-head, reject-publish or reject-publish-dlx'],
    ['Auto expire', 'expires', 'Number', 'milliseconds'], ['Message TTL', 'message-ttl', 'Number', 'milliseconds'],
    ['Dead letter exchange', 'dead-letter-exchange', 'String'], ['Dead letter routing key', 'dead-letter-routing-key', 'String'],
  ]],
  ['Queues [Classic]', [
    ['HA mode', 'ha-mode', 'String', 'all, exactly or nodes'],
    ['HA params', 'ha-params', 'Number', 'a count for exactly (Number), node names for nodes (List)'],
    ['HA sync mode', 'ha-sync-mode', 'String', 'manual or automatic'],
    ['HA sync batch size', 'ha-sync-batch-size', 'Number'],
    ['HA mirror promotion on shutdown', 'ha-promote-on-shutdown', 'String', 'when-synced or always'],
    ['HA mirror promotion on failure', 'ha-promote-on-failure', 'String', 'when-synced or always'],
    ['Lazy mode', 'queue-mode', 'String', 'default or lazy'],
    ['Master locator', 'queue-master-locator', 'String', 'min-masters, client-local or random'],
  ]],
  ['Queues [Quorum]', [['Delivery limit', 'delivery-limit', 'Number']]],
  ['Exchanges', [['Alternate exchange', 'alternate-exchange', 'String']]],
];

const OPERATOR_HELPERS = [
  ['Queues', [
    ['Max length', 'max-length', 'Number'], ['Max length bytes', 'max-length-bytes', 'Number'],
    ['Message TTL', 'message-ttl', 'Number'], ['Auto expire', 'expires', 'Number'],
    ['Delivery limit', 'delivery-limit', 'Number'],
  ]],
];

// One kind of policy (user or operator): its list, messages and add / update form, built
// once; a refresh redraws only the list. **Edit** loads a policy into the form.
function policyEditor(kind, base, helpers, onChange) {
  const id = kind === 'policy' ? 'policy' : 'operator-policy';
  const noun = kind === 'policy' ? 'policy' : 'operator policy';
  const listBox = h('div', { id: `${id}-list` });
  const out = h('div');
  const addOut = h('div');
  const def = kvEditor(`${id}-definition`, helpers);
  const form = h('form', { id: `add-${id}`, class: 'policy-form' });

  async function build() {
    form.onsubmit = (ev) => {
      ev.preventDefault();
      run(addOut, () => api.put(`${base}/${api.enc(val(form, 'vhost'))}/${api.enc(val(form, 'name'))}`, {
        pattern: val(form, 'pattern'), 'apply-to': val(form, 'apply-to'), priority: Number(val(form, 'priority') || 0), definition: def.value(),
      }), kind === 'policy' ? 'Policy set.' : 'Operator policy set.').then(onChange);
    };
    fill(form, h('table', { class: 'form' },
      row('Virtual host:', await vhostSelect()),
      row('Name:', h('input', { type: 'text', name: 'name', required: true })),
      row('Pattern:', h('input', { type: 'text', name: 'pattern', required: true })),
      row('Apply to:', select('apply-to', kind === 'policy'
        ? [['all', 'Exchanges and queues'], ['exchanges', 'Exchanges'], ['queues', 'Queues']] : [['queues', 'Queues']],
      kind === 'policy' ? 'all' : 'queues')),
      row('Priority:', h('input', { type: 'number', name: 'priority', value: '0' })),
      row('Definition:', def.el)),
    h('button', { type: 'submit' }, kind === 'policy' ? 'Add / update policy' : 'Add / update operator policy'));
  }

  function edit(p) {
    for (const [name, value] of [['vhost', p.vhost], ['name', p.name], ['pattern', p.pattern],
      ['apply-to', p['apply-to']], ['priority', String(p.priority ?? 0)]]) {
      const el = form.elements.namedItem(name);
      if (el) el.value = value;
    }
    def.load(p.definition || {});
    fill(addOut);
    form.scrollIntoView();
  }

  function show(rows) {
    fill(listBox, table([
      ['Virtual host', (p) => p.vhost], ['Name', (p) => p.name, 'name'], ['Pattern', (p) => p.pattern],
      ['Apply to', (p) => p['apply-to']], ['Definition', (p) => h('code', {}, JSON.stringify(p.definition))],
      ['Priority', (p) => p.priority, 'n'],
      ['', (p) => [h('button', { type: 'button', class: 'small', onclick: () => edit(p) }, 'Edit'), ' ',
        h('button', { type: 'button', class: 'small danger', onclick: () => {
          if (!window.confirm(`Delete ${noun} ${p.name}?`)) return;
          run(out, () => api.del(`${base}/${api.enc(p.vhost)}/${api.enc(p.name)}`), `Deleted ${noun} ${p.name}.`).then(onChange);
        } }, 'Delete')]],
    ], rows));
  }
  return { list: h('div', {}, listBox, out), form, addOut, build, show };
}

export function policies() {
  return gated('policies', 'policymaker', () => {
    const user = h('div');
    const operator = h('div');
    const forms = h('div');
    const el = adminFrame('policies', h('h1', {}, 'Policies'), user, operator, forms);
    const userEd = policyEditor('policy', '/api/policies', POLICY_HELPERS, () => refresh());
    let opEd = null;
    let built = false;
    async function refresh() {
      userEd.show(await api.get('/api/policies'));
      if (!built) fill(user, section('User policies', userEd.list));
      let ops = null;
      if (api.hasTag('administrator')) {
        ops = await api.optional('/api/operator-policies');
        if (ops === null) fill(operator, section('Operator policies', h('p', { class: 'dim' }, 'This node does not serve operator policies.')));
        else {
          if (!opEd) {
            opEd = policyEditor('operator', '/api/operator-policies', OPERATOR_HELPERS, () => refresh());
            fill(operator, section('Operator policies', opEd.list));
          }
          opEd.show(ops);
        }
      }
      if (!built) {
        built = true;
        await userEd.build();
        const parts = [section('Add / update a policy', userEd.form, userEd.addOut)];
        if (opEd) { await opEd.build(); parts.push(section('Add / update an operator policy', opEd.form, opEd.addOut)); }
        fill(forms, parts);
      }
    }
    return { el, refresh };
  });
}

// ------------------------------------------------------------------------------------ limits

// One kind of limit (per virtual host or per user): the list, a set form and its answer,
// built once; a change redraws only the list.
function limitsPart(kind) {
  const isVhost = kind === 'vhost';
  const base = isVhost ? '/api/vhost-limits' : '/api/user-limits';
  const owner = isVhost ? 'vhost' : 'user';
  const listBox = h('div', { id: `${kind}-limits` });
  const out = h('div');
  const form = h('form', { id: `set-${kind}-limit`, class: 'inline' });

  async function show() {
    const rows = await api.optional(base);
    if (rows === null) return false;
    const flat = [];
    for (const r of rows) for (const [k, v] of Object.entries(r.value || {})) flat.push({ owner: r[owner], key: k, value: v });
    fill(listBox, table([
      [isVhost ? 'Virtual host' : 'User', (r) => r.owner, 'name'], ['Limit', (r) => r.key], ['Value', (r) => num(r.value), 'n'],
      ['', (r) => h('button', { type: 'button', class: 'small', onclick: () =>
        run(out, () => api.del(`${base}/${api.enc(r.owner)}/${api.enc(r.key)}`), 'Limit cleared.').then(show) }, 'Clear')],
    ], flat));
    return true;
  }

  form.onsubmit = (ev) => {
    ev.preventDefault();
    run(out, () => api.put(`${base}/${api.enc(val(form, 'owner'))}/${api.enc(val(form, 'limit'))}`, { value: Number(val(form, 'value')) }),
      'Limit set.').then(show);
  };
  fill(form, h('label', {}, isVhost ? 'Virtual host ' : 'User ', h('input', { type: 'text', name: 'owner', size: 12 })), ' ',
    h('label', {}, 'Limit ', select('limit', isVhost ? ['max-connections', 'max-queues'] : ['max-connections', 'max-channels'], 'max-connections')), ' ',
    h('label', {}, 'Value ', h('input', { type: 'number', name: 'value', size: 6 })), ' ', h('button', { type: 'submit' }, 'Set / update limit'));
  return { el: h('div', {}, listBox, form, out), show };
}

export function limits() {
  return gated('limits', 'administrator', () => {
    const vh = h('div');
    const us = h('div');
    const el = adminFrame('limits', h('h1', {}, 'Limits'), vh, us);
    const parts = [[vh, limitsPart('vhost'), 'Virtual host limits', 'virtual host limits'], [us, limitsPart('user'), 'User limits', 'user limits']];
    let shown = false;
    async function refresh() {
      for (const [box, part, title, what] of parts) {
        const served = await part.show();
        if (!shown) fill(box, section(title, served ? part.el : h('p', { class: 'dim' }, `This node does not serve ${what}.`)));
      }
      shown = true;
    }
    return { el, refresh };
  });
}

// ----------------------------------------------------------------------------------- cluster

export function cluster() {
  return gated('cluster', 'administrator', () => {
    const nodes = h('div', { id: 'cluster-nodes' });
    const out = h('div');
    const name = h('input', { type: 'text', name: 'cluster-name', size: 30 });
    const form = h('form', { class: 'inline', onsubmit: (ev) => {
      ev.preventDefault();
      run(out, () => api.put('/api/cluster-name', { name: name.value }), 'Cluster name updated.');
    } }, h('label', {}, 'Cluster name ', name), ' ', h('button', { type: 'submit' }, 'Update'));
    const el = adminFrame('cluster', h('h1', {}, 'Cluster'), section('Cluster name', form, out), section('Nodes', nodes));
    let named = false;
    async function refresh() {
      const [ns, cl, cn] = await Promise.all([api.get('/api/nodes'), api.optional('/api/hutch/cluster'), named ? null : api.get('/api/cluster-name')]);
      if (cn) { named = true; name.value = cn.name; }
      fill(nodes, nodesTable(ns, cl));
    }
    return { el, refresh };
  });
}
