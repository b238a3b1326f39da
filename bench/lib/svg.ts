/** Hand-written SVG charts (grouped bars, lines, flame graphs) for the benchmark report: no dependencies. */
import type { FlameNode as FlameFrame } from './cpuprofile.js';

const PALETTE = ['#4e79a7', '#f28e2b', '#59a14f', '#e15759', '#76b7b2', '#edc948', '#b07aa1', '#9c755f'];
const FONT = 'font-family="Helvetica, Arial, sans-serif"';

function esc(s: string): string {
  return s.replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;').replace(/"/g, '&quot;');
}

/** A "nice" axis maximum and tick step for values up to `max`. */
function niceScale(max: number, ticks = 5): { top: number; step: number } {
  if (!(max > 0) || !Number.isFinite(max)) return { top: 1, step: 0.2 };
  const raw = max / ticks;
  const mag = 10 ** Math.floor(Math.log10(raw));
  const norm = raw / mag;
  const step = (norm <= 1 ? 1 : norm <= 2 ? 2 : norm <= 2.5 ? 2.5 : norm <= 5 ? 5 : 10) * mag;
  return { top: Math.ceil(max / step) * step, step };
}

function num(v: number): string {
  if (Math.abs(v) >= 1000) return Math.round(v).toLocaleString('en-US');
  if (Math.abs(v) >= 10) return String(Math.round(v));
  return String(Math.round(v * 100) / 100);
}

function legend(series: string[], x: number, y: number): string {
  let out = '';
  let cx = x;
  for (const [i, s] of series.entries()) {
    out += `<rect x="${cx}" y="${y - 10}" width="12" height="12" fill="${PALETTE[i % PALETTE.length]}"/>`;
    out += `<text x="${cx + 16}" y="${y}" font-size="12" ${FONT}>${esc(s)}</text>`;
    cx += 28 + s.length * 7;
  }
  return out;
}

export interface BarGroup {
  label: string;
  /** One value per series (NaN = missing). */
  values: number[];
}

export interface BarChartSpec {
  title: string;
  yLabel: string;
  series: string[];
  groups: BarGroup[];
  /** Horizontal reference line(s), e.g. a target. */
  refLines?: Array<{ value: number; label: string }>;
  width?: number;
  height?: number;
  /** Print the value above each bar. */
  labels?: boolean;
}

export function barChart(spec: BarChartSpec): string {
  const W = spec.width ?? 760;
  const H = spec.height ?? 360;
  const m = { top: 48, right: 20, bottom: 56, left: 70 };
  const pw = W - m.left - m.right;
  const ph = H - m.top - m.bottom;
  const all = spec.groups.flatMap((g) => g.values).filter(Number.isFinite);
  const refMax = Math.max(0, ...(spec.refLines ?? []).map((r) => r.value));
  const { top, step } = niceScale(Math.max(...all, refMax) * 1.08);
  const y = (v: number): number => m.top + ph - (Math.min(v, top) / top) * ph;
  let out = `<svg xmlns="http://www.w3.org/2000/svg" width="${W}" height="${H}" viewBox="0 0 ${W} ${H}">`;
  out += `<rect width="${W}" height="${H}" fill="white"/>`;
  out += `<text x="${W / 2}" y="20" text-anchor="middle" font-size="15" font-weight="bold" ${FONT}>${esc(spec.title)}</text>`;
  out += legend(spec.series, m.left, 40);
  for (let v = 0; v <= top + step / 2; v += step) {
    out += `<line x1="${m.left}" x2="${m.left + pw}" y1="${y(v)}" y2="${y(v)}" stroke="#ddd"/>`;
    out += `<text x="${m.left - 6}" y="${y(v) + 4}" text-anchor="end" font-size="11" ${FONT}>${num(v)}</text>`;
  }
  out += `<text transform="translate(16 ${m.top + ph / 2}) rotate(-90)" text-anchor="middle" font-size="12" ${FONT}>${esc(spec.yLabel)}</text>`;
  const gw = pw / Math.max(1, spec.groups.length);
  const bw = Math.min(40, (gw * 0.8) / Math.max(1, spec.series.length));
  for (const [gi, g] of spec.groups.entries()) {
    const gx = m.left + gi * gw + (gw - bw * spec.series.length) / 2;
    for (const [si, v] of g.values.entries()) {
      if (!Number.isFinite(v)) continue;
      const x = gx + si * bw;
      out += `<rect x="${x}" y="${y(v)}" width="${bw - 2}" height="${m.top + ph - y(v)}" fill="${PALETTE[si % PALETTE.length]}"><title>${esc(`${g.label} / ${spec.series[si]}: ${num(v)}`)}</title></rect>`;
      if (spec.labels !== false) out += `<text x="${x + (bw - 2) / 2}" y="${y(v) - 3}" text-anchor="middle" font-size="9" ${FONT}>${num(v)}</text>`;
    }
    out += `<text x="${m.left + gi * gw + gw / 2}" y="${m.top + ph + 18}" text-anchor="middle" font-size="12" ${FONT}>${esc(g.label)}</text>`;
  }
  for (const r of spec.refLines ?? []) {
    out += `<line x1="${m.left}" x2="${m.left + pw}" y1="${y(r.value)}" y2="${y(r.value)}" stroke="#c00" stroke-dasharray="6 4"/>`;
    out += `<text x="${m.left + pw - 4}" y="${y(r.value) - 4}" text-anchor="end" font-size="11" fill="#c00" ${FONT}>${esc(r.label)}</text>`;
  }
  out += `<line x1="${m.left}" x2="${m.left}" y1="${m.top}" y2="${m.top + ph}" stroke="#333"/>`;
  out += `<line x1="${m.left}" x2="${m.left + pw}" y1="${m.top + ph}" y2="${m.top + ph}" stroke="#333"/>`;
  return out + '</svg>\n';
}

export interface LineSeries {
  name: string;
  points: Array<[number, number]>;
}

export interface LineChartSpec {
  title: string;
  xLabel: string;
  yLabel: string;
  series: LineSeries[];
  logX?: boolean;
  logY?: boolean;
  /** Values above are drawn at the top edge (with an arrow) — e.g. ∞ TTFT. */
  yMax?: number;
  xTicks?: number[];
  xTickFormat?: (x: number) => string;
  refLines?: Array<{ value: number; label: string }>;
  vLines?: Array<{ value: number; label: string }>;
  width?: number;
  height?: number;
}

export function lineChart(spec: LineChartSpec): string {
  const W = spec.width ?? 760;
  const H = spec.height ?? 380;
  const m = { top: 48, right: 24, bottom: 52, left: 74 };
  const pw = W - m.left - m.right;
  const ph = H - m.top - m.bottom;
  const pts = spec.series.flatMap((s) => s.points);
  const xs = pts.map((p) => p[0]).filter(Number.isFinite);
  const ysFinite = pts.map((p) => p[1]).filter(Number.isFinite);
  const refMax = Math.max(0, ...(spec.refLines ?? []).map((r) => r.value));
  const yCap = spec.yMax ?? Math.max(...ysFinite, refMax, 1e-9) * 1.08;
  const xmin = Math.min(...xs);
  const xmax = Math.max(...xs);
  const tx = (x: number): number => {
    if (spec.logX) return m.left + ((Math.log(x) - Math.log(xmin)) / Math.max(1e-9, Math.log(xmax) - Math.log(xmin))) * pw;
    return m.left + ((x - xmin) / Math.max(1e-9, xmax - xmin)) * pw;
  };
  let yTicks: number[];
  let ty: (v: number) => number;
  if (spec.logY) {
    const lo = Math.max(1e-9, Math.min(...ysFinite.filter((v) => v > 0)));
    const lmin = Math.floor(Math.log10(lo));
    const lmax = Math.ceil(Math.log10(yCap));
    ty = (v: number): number => m.top + ph - ((Math.log10(Math.max(v, 10 ** lmin)) - lmin) / Math.max(1e-9, lmax - lmin)) * ph;
    yTicks = [];
    for (let e = lmin; e <= lmax; e++) yTicks.push(10 ** e);
  } else {
    const { top, step } = niceScale(yCap);
    ty = (v: number): number => m.top + ph - (Math.min(v, top) / top) * ph;
    yTicks = [];
    for (let v = 0; v <= top + step / 2; v += step) yTicks.push(v);
  }
  const yTop = yTicks[yTicks.length - 1]!;
  let out = `<svg xmlns="http://www.w3.org/2000/svg" width="${W}" height="${H}" viewBox="0 0 ${W} ${H}">`;
  out += `<rect width="${W}" height="${H}" fill="white"/>`;
  out += `<text x="${W / 2}" y="20" text-anchor="middle" font-size="15" font-weight="bold" ${FONT}>${esc(spec.title)}</text>`;
  out += legend(spec.series.map((s) => s.name), m.left, 40);
  for (const v of yTicks) {
    out += `<line x1="${m.left}" x2="${m.left + pw}" y1="${ty(v)}" y2="${ty(v)}" stroke="#ddd"/>`;
    out += `<text x="${m.left - 6}" y="${ty(v) + 4}" text-anchor="end" font-size="11" ${FONT}>${num(v)}</text>`;
  }
  const xTicks = spec.xTicks ?? [...new Set(xs)].sort((a, b) => a - b);
  for (const x of xTicks) {
    out += `<line x1="${tx(x)}" x2="${tx(x)}" y1="${m.top + ph}" y2="${m.top + ph + 4}" stroke="#333"/>`;
    out += `<text x="${tx(x)}" y="${m.top + ph + 17}" text-anchor="middle" font-size="11" ${FONT}>${esc(spec.xTickFormat ? spec.xTickFormat(x) : num(x))}</text>`;
  }
  out += `<text x="${m.left + pw / 2}" y="${H - 10}" text-anchor="middle" font-size="12" ${FONT}>${esc(spec.xLabel)}</text>`;
  out += `<text transform="translate(16 ${m.top + ph / 2}) rotate(-90)" text-anchor="middle" font-size="12" ${FONT}>${esc(spec.yLabel)}</text>`;
  for (const r of spec.refLines ?? []) {
    out += `<line x1="${m.left}" x2="${m.left + pw}" y1="${ty(r.value)}" y2="${ty(r.value)}" stroke="#c00" stroke-dasharray="6 4"/>`;
    out += `<text x="${m.left + pw - 4}" y="${ty(r.value) - 4}" text-anchor="end" font-size="11" fill="#c00" ${FONT}>${esc(r.label)}</text>`;
  }
  for (const r of spec.vLines ?? []) {
    out += `<line x1="${tx(r.value)}" x2="${tx(r.value)}" y1="${m.top}" y2="${m.top + ph}" stroke="#888" stroke-dasharray="4 4"/>`;
    out += `<text x="${tx(r.value) + 4}" y="${m.top + 12}" font-size="11" fill="#555" ${FONT}>${esc(r.label)}</text>`;
  }
  for (const [i, s] of spec.series.entries()) {
    const color = PALETTE[i % PALETTE.length];
    const p = s.points.filter((q) => Number.isFinite(q[0]) && !Number.isNaN(q[1]));
    if (p.length === 0) continue;
    const d = p.map((q, k) => `${k === 0 ? 'M' : 'L'}${tx(q[0]).toFixed(1)},${ty(Math.min(q[1], yTop)).toFixed(1)}`).join(' ');
    out += `<path d="${d}" fill="none" stroke="${color}" stroke-width="2"/>`;
    for (const q of p) {
      const over = q[1] > yTop;
      out += `<circle cx="${tx(q[0]).toFixed(1)}" cy="${ty(Math.min(q[1], yTop)).toFixed(1)}" r="${over ? 5 : 3}" fill="${over ? 'white' : color}" stroke="${color}" stroke-width="2"><title>${esc(`${s.name}: ${num(q[0])} → ${Number.isFinite(q[1]) ? num(q[1]) : '∞'}`)}</title></circle>`;
    }
  }
  out += `<line x1="${m.left}" x2="${m.left}" y1="${m.top}" y2="${m.top + ph}" stroke="#333"/>`;
  out += `<line x1="${m.left}" x2="${m.left + pw}" y1="${m.top + ph}" y2="${m.top + ph}" stroke="#333"/>`;
  return out + '</svg>\n';
}


export interface FlameGraphSpec {
  title: string;
  root: FlameFrame;
  /** What the widths measure, for the tooltips (default 'busy time'; a heap profile: 'sampled memory'). */
  measure?: string;
  width?: number;
}

/** What a frame's code is, for its colour: whose time it is matters more than which function. */
export function frameKind(f: Pick<FlameFrame, 'name' | 'at'>): 'Sluice' | 'undici' | 'Node.js' | 'other modules' | 'GC' | 'V8, native' {
  if (f.at.startsWith('src/') || f.at.startsWith('dist/')) return 'Sluice';
  // The gateway's only WebAssembly is undici's HTTP parser (llhttp).
  if (f.at.startsWith('undici/') || f.at.startsWith('wasm://')) return 'undici';
  if (f.at.startsWith('node:')) return 'Node.js';
  if (f.at !== '') return 'other modules';
  return f.name === '(garbage collector)' ? 'GC' : 'V8, native';
}

const FLAME_HUES: Record<ReturnType<typeof frameKind>, [number, number]> = {
  Sluice: [24, 85],
  undici: [210, 60],
  'Node.js': [120, 40],
  'other modules': [280, 40],
  GC: [0, 70],
  'V8, native': [0, 0],
};

/**
 * A flame graph (root at the bottom, each frame as wide as its share of the measure — busy time, or
 * a heap profile's memory — callees above their caller, widest first), coloured by whose code runs;
 * every frame carries a tooltip with its location and its total and self shares.
 */
export function flameGraph(spec: FlameGraphSpec): string {
  const W = spec.width ?? 1200;
  const rowH = 17;
  const m = { top: 56, side: 10, bottom: 10 };
  const pw = W - 2 * m.side;
  const total = spec.root.total;
  const rects: string[] = [];
  let maxDepth = 0;
  const walk = (f: FlameFrame, depth: number, x: number): void => {
    const w = total > 0 ? (f.total / total) * pw : 0;
    maxDepth = Math.max(maxDepth, depth);
    rects.push(frameRect(f, depth, x, w, total));
    let cx = x;
    for (const c of f.children) {
      walk(c, depth + 1, cx);
      cx += total > 0 ? (c.total / total) * pw : 0;
    }
  };
  walk(spec.root, 0, m.side);
  const H = m.top + (maxDepth + 1) * rowH + m.bottom;
  let out = `<svg xmlns="http://www.w3.org/2000/svg" width="${W}" height="${H}" viewBox="0 0 ${W} ${H}">`;
  out += `<rect width="${W}" height="${H}" fill="white"/>`;
  out += `<text x="${W / 2}" y="20" text-anchor="middle" font-size="15" font-weight="bold" ${FONT}>${esc(spec.title)}</text>`;
  let lx = m.side;
  for (const [kind, [h, s]] of Object.entries(FLAME_HUES)) {
    out += `<rect x="${lx}" y="32" width="12" height="12" fill="hsl(${h},${s}%,62%)"/>`;
    out += `<text x="${lx + 16}" y="42" font-size="12" ${FONT}>${esc(kind)}</text>`;
    lx += 28 + kind.length * 7;
  }
  // Rows are laid out from the bottom: depth 0 (all) is the last row.
  const base = m.top + maxDepth * rowH;
  out += `<g transform="translate(0 ${base})">${rects.join('')}</g>`;
  return out + '</svg>\n';

  function frameRect(f: FlameFrame, depth: number, x: number, w: number, all: number): string {
    const y = -depth * rowH;
    const [h, s] = FLAME_HUES[frameKind(f)];
    // Neighbouring frames of one kind differ a little in lightness (from the name), as in classic flame graphs.
    let n = 0;
    for (let i = 0; i < f.name.length; i++) n = (n * 31 + f.name.charCodeAt(i)) >>> 0;
    const light = 55 + (n % 20);
    const pct = (v: number): string => `${all > 0 ? ((v / all) * 100).toFixed(1) : '0'} %`;
    const tip = `${f.name}${f.at ? ` — ${f.at}` : ''}\n${pct(f.total)} of ${spec.measure ?? 'busy time'} (self ${pct(f.self)})`;
    let r = `<g><title>${esc(tip)}</title><rect x="${x.toFixed(2)}" y="${y}" width="${Math.max(0, w - 0.5).toFixed(2)}" height="${rowH - 1}" fill="hsl(${h},${s}%,${light}%)"/>`;
    const fit = Math.floor((w - 6) / 6.6);
    if (fit >= 3) {
      const label = f.name.length <= fit ? f.name : `${f.name.slice(0, fit - 2)}..`;
      r += `<text x="${(x + 3).toFixed(2)}" y="${y + rowH - 5}" font-size="11" ${FONT}>${esc(label)}</text>`;
    }
    return r + '</g>';
  }
}
