/** Small statistics and formatting helpers. */

/** Quantile q ∈ [0,1] of an ascending-sorted array (nearest rank); NaN when empty. Infinity entries count. */
export function quantileSorted(sorted: readonly number[], q: number): number {
  if (sorted.length === 0) return NaN;
  const i = Math.min(sorted.length - 1, Math.max(0, Math.ceil(q * sorted.length) - 1));
  return sorted[i]!;
}

export interface Summary {
  n: number;
  p50: number;
  p90: number;
  p99: number;
  mean: number;
  max: number;
}

/** Percentiles of `values` (copied and sorted); the mean ignores non-finite values. */
export function summarize(values: readonly number[]): Summary {
  const s = [...values].sort((a, b) => a - b);
  const finite = s.filter(Number.isFinite);
  return {
    n: s.length,
    p50: quantileSorted(s, 0.5),
    p90: quantileSorted(s, 0.9),
    p99: quantileSorted(s, 0.99),
    mean: finite.length ? finite.reduce((a, b) => a + b, 0) / finite.length : NaN,
    max: s.length ? s[s.length - 1]! : NaN,
  };
}

export function fmt(n: number | undefined, digits = 2): string {
  if (n === undefined || Number.isNaN(n)) return '–';
  if (n === Infinity) return '∞';
  return n.toFixed(digits);
}

export function fmtInt(n: number | undefined): string {
  if (n === undefined || !Number.isFinite(n)) return '–';
  return Math.round(n).toLocaleString('en-US');
}

export function mb(bytes: number): number {
  return bytes / (1024 * 1024);
}

/** A console table with left-aligned first `left` columns and right-aligned numbers. */
export function textTable(header: string[], rows: string[][], left = 1): string {
  const widths = header.map((h, i) => Math.max(h.length, ...rows.map((r) => (r[i] ?? '').length)));
  const line = (cells: string[]): string =>
    cells.map((c, i) => (i < left ? c.padEnd(widths[i]!) : c.padStart(widths[i]!))).join('  ');
  return [line(header), ...rows.map(line)].join('\n');
}

/** A Markdown table. */
export function mdTable(header: string[], rows: string[][], left = 1): string {
  const sep = header.map((_, i) => (i < left ? '---' : '---:'));
  return [header, sep, ...rows].map((r) => `| ${r.join(' | ')} |`).join('\n');
}

/** Exponential inter-arrival gap (ms) for a Poisson process of `ratePerSec`, from a uniform source. */
export function expGapMs(ratePerSec: number, random: () => number): number {
  return (-Math.log(1 - random()) / ratePerSec) * 1000;
}
