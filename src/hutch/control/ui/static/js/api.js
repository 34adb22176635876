// The UI's only way to the broker: the management HTTP API with HTTP basic credentials.
// The credentials of the logged-in user live in sessionStorage (gone when the tab closes),
// as RabbitMQ's UI keeps them in a cookie, and go with every request.

const KEY = 'hutch.login';
const listeners = new Set();

export class ApiError extends Error {
  constructor(status, error, reason) {
    super(reason || error || `HTTP ${status}`);
    this.status = status;
    this.error = error;
    this.reason = reason;
  }
}

export function basicToken(user, password) {
  const raw = new TextEncoder().encode(`${user}:${password}`);
  let s = '';
  for (const b of raw) s += String.fromCharCode(b);
  return btoa(s);
}

export function login() {
  try {
    const raw = sessionStorage.getItem(KEY);
    return raw ? JSON.parse(raw) : null;
  } catch (_) {
    return null;
  }
}

export function saveLogin(name, token, tags) {
  sessionStorage.setItem(KEY, JSON.stringify({ name, token, tags }));
}

export function logout() {
  sessionStorage.removeItem(KEY);
  for (const f of listeners) f();
}

export function onLogout(f) { listeners.add(f); }

// RabbitMQ's tag hierarchy: administrator implies every tag; policymaker and monitoring
// imply management.
export function hasTag(tag) {
  const me = login();
  const tags = new Set(me ? me.tags : []);
  if (tags.has('administrator')) return true;
  if (tag === 'management') {
    return ['management', 'policymaker', 'monitoring'].some((t) => tags.has(t));
  }
  return tags.has(tag);
}

async function errorOf(resp) {
  let body = null;
  try { body = await resp.json(); } catch (_) { body = null; }
  return new ApiError(resp.status, body && body.error, body && body.reason);
}

export async function call(method, path, body, { token, headers } = {}) {
  const me = login();
  const auth = token || (me && me.token);
  // credentials 'omit': the browser then never opens its own login dialog on the API's 401
  // challenge (the Fetch standard prompts only for requests that include credentials); the
  // Authorization header is set here explicitly instead.
  const init = { method, credentials: 'omit', headers: { ...(headers || {}) } };
  if (auth) init.headers.Authorization = `Basic ${auth}`;
  if (body !== undefined) {
    init.headers['Content-Type'] = 'application/json';
    init.body = JSON.stringify(body);
  }
  const resp = await fetch(path, init);
  if (!resp.ok) {
    const err = await errorOf(resp);
    if (resp.status === 401 && !token && err.reason === 'Login failed') logout();
    throw err;
  }
  if (resp.status === 204) return null;
  const text = await resp.text();
  return text ? JSON.parse(text) : null;
}

export const get = (path, opts) => call('GET', path, undefined, opts);
export const put = (path, body, opts) => call('PUT', path, body === undefined ? {} : body, opts);
export const post = (path, body, opts) => call('POST', path, body === undefined ? {} : body, opts);
export const del = (path, opts) => call('DELETE', path, undefined, opts);

// GET that answers null when the route is not served (an API this node does not have yet).
export async function optional(path) {
  try {
    return await get(path);
  } catch (e) {
    if (e.status === 404 || e.status === 405) return null;
    throw e;
  }
}

export const enc = encodeURIComponent;
