// Line charts drawn as inline SVG: no library, nothing fetched. A series is
// {label, color, points: [[timestamp_ms, value], ...]}; the x axis spans the last
// `spanS` seconds up to the newest point. A series may carry `current`, the value its
// legend shows (a rate the API computed) instead of the newest point's.

import { h } from './dom.js';

const NS = 'http://www.w3.org/2000/svg';

function s(tag, attrs, ...children) {
  const el = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs || {})) el.setAttribute(k, v);
  for (const c of children) el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return el;
}

function niceMax(v) {
  if (v <= 0) return 1;
  const p = 10 ** Math.floor(Math.log10(v));
  for (const m of [1, 2, 5, 10]) if (m * p >= v) return m * p;
  return 10 * p;
}

export function lineChart(series, { spanS = 600, width = 520, height = 150, unit = '' } = {}) {
  const left = 48; const right = 8; const top = 8; const bottom = 20;
  const w = width - left - right; const ht = height - top - bottom;
  const all = series.flatMap((x) => x.points);
  const tMax = all.length ? Math.max(...all.map((p) => p[0])) : Date.now();
  const tMin = tMax - spanS * 1000;
  const yMax = niceMax(Math.max(0, ...all.map((p) => p[1])));
  const x = (t) => left + ((t - tMin) / (tMax - tMin)) * w;
  const y = (v) => top + ht - (v / yMax) * ht;
  const svg = s('svg', { viewBox: `0 0 ${width} ${height}`, width, height, class: 'chart', role: 'img' });
  for (const f of [0, 0.5, 1]) {
    const v = yMax * f;
    svg.append(s('line', { x1: left, x2: left + w, y1: y(v), y2: y(v), class: 'grid' }));
    svg.append(s('text', { x: left - 4, y: y(v) + 4, 'text-anchor': 'end', class: 'axis' }, `${Number(v.toPrecision(3))}${unit}`));
  }
  for (const m of [spanS, spanS / 2, 0]) {
    const label = m === 0 ? 'now' : `-${Math.round(m / 60)}m`;
    svg.append(s('text', { x: x(tMax - m * 1000), y: height - 4, 'text-anchor': m === spanS ? 'start' : (m === 0 ? 'end' : 'middle'), class: 'axis' }, label));
  }
  for (const ser of series) {
    const pts = ser.points.filter((p) => p[0] >= tMin).sort((a, b) => a[0] - b[0]);
    if (pts.length === 0) continue;
    if (pts.length === 1) {
      svg.append(s('circle', { cx: x(pts[0][0]), cy: y(pts[0][1]), r: 2.5, fill: ser.color }));
      continue;
    }
    svg.append(s('polyline', { points: pts.map((p) => `${x(p[0]).toFixed(1)},${y(p[1]).toFixed(1)}`).join(' '), fill: 'none', stroke: ser.color, 'stroke-width': 2 }));
  }
  const legend = h('ul', { class: 'legend' }, series.map((ser) => {
    let last = ser.points.length ? ser.points.reduce((a, b) => (b[0] > a[0] ? b : a))[1] : null;
    if (ser.current !== undefined) last = ser.current;
    return h('li', {}, h('span', { class: 'swatch', style: `background:${ser.color}` }), ser.label,
      h('strong', {}, last === null ? '' : ` ${Number(last.toFixed(2)).toLocaleString('en-US')}${unit}`));
  }));
  return h('div', { class: 'chartbox' }, svg, legend);
}

// Points from a RabbitMQ-style history ({samples: [{sample, timestamp}, ...]}, newest first).
export function samplePoints(details) {
  if (!details || !Array.isArray(details.samples)) return null;
  return details.samples.map((p) => [p.timestamp, p.sample]);
}

// Rates from the samples of a counter: the change between neighbouring samples per second.
export function ratePoints(details) {
  const pts = samplePoints(details);
  if (!pts) return null;
  pts.sort((a, b) => a[0] - b[0]);
  const out = [];
  for (let i = 1; i < pts.length; i += 1) {
    const dt = (pts[i][0] - pts[i - 1][0]) / 1000;
    if (dt > 0) out.push([pts[i][0], Math.max(0, (pts[i][1] - pts[i - 1][1]) / dt)]);
  }
  return out;
}
