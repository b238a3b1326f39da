/**
 * Reading a Prometheus text page for the soak (bench/soak.ts): parse once, then sum / group series
 * by label. Only what the soak needs: no exemplars, no timestamps, no histogram math.
 */

export interface PromSample {
  name: string;
  labels: Record<string, string>;
  value: number;
}

const LABEL_RE = /([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g;

function unescape(v: string): string {
  return v.replace(/\\(.)/g, (_m, c: string) => (c === 'n' ? '\n' : c));
}

/** Every sample line of a text exposition (comments and blank lines skipped). */
export function parseProm(text: string): PromSample[] {
  const out: PromSample[] = [];
  for (const line of text.split('\n')) {
    if (line === '' || line.startsWith('#')) continue;
    const brace = line.indexOf('{');
    const space = line.lastIndexOf(' ');
    if (space <= 0) continue;
    let name: string;
    const labels: Record<string, string> = {};
    if (brace > 0 && brace < space) {
      name = line.slice(0, brace);
      const close = line.lastIndexOf('}');
      for (const m of line.slice(brace + 1, close).matchAll(LABEL_RE)) labels[m[1]!] = unescape(m[2]!);
    } else {
      name = line.slice(0, line.indexOf(' '));
    }
    const raw = line.slice(space + 1).trim();
    const value = raw === '+Inf' ? Infinity : raw === '-Inf' ? -Infinity : Number(raw);
    out.push({ name, labels, value });
  }
  return out;
}

export class PromPage {
  readonly samples: PromSample[];
  constructor(readonly text: string) {
    this.samples = parseProm(text);
  }

  series(name: string, match: Record<string, string> = {}): PromSample[] {
    return this.samples.filter((s) => s.name === name && Object.entries(match).every(([k, v]) => s.labels[k] === v));
  }

  has(name: string): boolean {
    return this.samples.some((s) => s.name === name);
  }

  /** Sum of every series of `name` (matching `match`); 0 when there is none. */
  sum(name: string, match: Record<string, string> = {}): number {
    return this.series(name, match).reduce((a, s) => a + s.value, 0);
  }

  /** Value of the one unlabelled (or first) series of `name`, or undefined. */
  value(name: string): number | undefined {
    return this.series(name)[0]?.value;
  }

  /** Sums of `name` grouped by the value of `label` (series without it under ''). */
  by(name: string, label: string): Record<string, number> {
    const out: Record<string, number> = {};
    for (const s of this.series(name)) {
      const key = s.labels[label] ?? '';
      out[key] = (out[key] ?? 0) + s.value;
    }
    return out;
  }

  /** Every series of `name` whose value is not 0, as `labels → value` (for "must all be zero" reports). */
  nonZero(name: string): { labels: Record<string, string>; value: number }[] {
    return this.series(name)
      .filter((s) => s.value !== 0)
      .map((s) => ({ labels: s.labels, value: s.value }));
  }
}
