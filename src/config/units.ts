/**
 * Config units: Go-style durations ("200ms", "1h30m") and Kubernetes quantities ("16Mi", "1G").
 * Durations are returned in milliseconds (fractions allowed below 1 ms); quantities as integers.
 * Arithmetic is done on integers (nanoseconds, BigInt digits) so "1.1s" is exactly 1100 ms.
 */

const NS_PER_UNIT: Record<string, number> = {
  ns: 1,
  us: 1e3,
  'µs': 1e3, // U+00B5 micro sign, as Go prints it
  'μs': 1e3, // U+03BC Greek mu, also accepted by Go
  ms: 1e6,
  s: 1e9,
  m: 60e9,
  h: 3600e9,
};

const NS_PER_MS = 1e6;
const DURATION_UNITS_HELP = 'ns, us, ms, s, m, h';
const DURATION_EXAMPLES = 'e.g. "200ms", "1.5s", "5m", "1h30m"';
// Longest unit names first within each prefix family, so "ms" wins over "m".
const DURATION_TERM = /^(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)/;

/** 2^63 − 1 ns, Go's longest time.Duration (as a double: 2^63). */
const GO_MAX_DURATION_NS = 9223372036854775807;

function parseDurationNs(s: string): number {
  if (typeof s !== 'string') throw new Error(`invalid duration ${String(s)}: expected a string (${DURATION_EXAMPLES})`);
  let rest = s;
  if (rest.startsWith('-')) throw new Error(`invalid duration "${s}": must not be negative`);
  if (rest.startsWith('+')) rest = rest.slice(1);
  if (rest === '0') return 0;
  if (rest === '') throw new Error(`invalid duration "${s}": empty (${DURATION_EXAMPLES})`);
  let totalNs = 0;
  while (rest.length > 0) {
    const m = DURATION_TERM.exec(rest);
    if (!m) {
      if (/^(\d+(?:\.\d*)?|\.\d+)$/.test(rest)) {
        throw new Error(`invalid duration "${s}": missing unit (${DURATION_UNITS_HELP}), ${DURATION_EXAMPLES}`);
      }
      throw new Error(`invalid duration "${s}": expected numbers with units (${DURATION_UNITS_HELP}), ${DURATION_EXAMPLES}`);
    }
    const [term, num, unit] = m as unknown as [string, string, string];
    const unitNs = NS_PER_UNIT[unit]!;
    const [intDigits, fracDigits = ''] = num.split('.') as [string, string?];
    const intPart = intDigits === '' ? 0 : Number(intDigits);
    const fracPart = fracDigits === '' ? 0 : Math.round((Number(fracDigits) * unitNs) / 10 ** fracDigits.length);
    totalNs += intPart * unitNs + fracPart;
    rest = rest.slice(term.length);
  }
  // Go's limit (int64 nanoseconds), so any duration llm-d takes loads; past 2^53 ns (~2501 h) the
  // value is inexact, which no setting notices: every duration is capped at Node's longest timer.
  if (!(totalNs <= GO_MAX_DURATION_NS)) throw new Error(`invalid duration "${s}": too large (Go's limit is 2562047h)`);
  return totalNs;
}

/** Parses a Go-style duration ("200ms", "1.5s", "5m", "1h30m", "0s", "0") into milliseconds. */
export function parseDuration(s: string): number {
  return parseDurationNs(s) / NS_PER_MS;
}

/**
 * Shortest string that parses back to exactly `ms`, avoiding "0.x" forms:
 * 50 → "50ms", 200 → "200ms", 1000 → "1s", 1500 → "1.5s", 300000 → "5m", 5400000 → "90m".
 */
export function formatDuration(ms: number): string {
  if (!Number.isFinite(ms) || ms < 0) throw new Error(`cannot format duration ${ms}`);
  const ns = Math.round(ms * NS_PER_MS);
  if (ns === 0) return '0s';
  const candidates: string[] = [];
  const units = ['h', 'm', 's', 'ms', 'us', 'ns'] as const;
  for (const unit of units) {
    const v = ns / NS_PER_UNIT[unit]!;
    const text = String(v);
    if (!text.includes('e')) candidates.push(`${text}${unit}`);
  }
  // Compound Go style (1h30m, 2m5s); zero parts are skipped since they only add length.
  const hours = Math.floor(ns / NS_PER_UNIT.h!);
  const minutes = Math.floor((ns % NS_PER_UNIT.h!) / NS_PER_UNIT.m!);
  const restNs = ns % NS_PER_UNIT.m!;
  if (hours > 0 || minutes > 0) {
    let compound = (hours > 0 ? `${hours}h` : '') + (minutes > 0 ? `${minutes}m` : '');
    if (restNs > 0) compound += formatDuration(restNs / NS_PER_MS);
    candidates.push(compound);
  }
  let best: string | undefined;
  for (const c of candidates) {
    let exact = false;
    try {
      exact = parseDurationNs(c) === ns;
    } catch {
      exact = false;
    }
    // "200ms" reads better than "0.2s": a fraction below one unit only wins when nothing else fits.
    const rank = (x: string): number => x.length + (x.startsWith('0.') ? 100 : 0);
    if (exact && (best === undefined || rank(c) < rank(best))) best = c;
  }
  return best ?? `${ns}ns`;
}

const DECIMAL_SUFFIX_EXP: Record<string, number> = { n: -9, u: -6, m: -3, '': 0, k: 3, M: 6, G: 9, T: 12, P: 15, E: 18 };
const BINARY_SUFFIX_POW: Record<string, number> = { Ki: 1, Mi: 2, Gi: 3, Ti: 4, Pi: 5, Ei: 6 };
// Exponent form is tried before the suffix "E" so "1E3" is 1000 and "1E" is 10^18.
const QUANTITY = /^([+-]?)(\d+(?:\.\d*)?|\.\d+)(?:[eE]([+-]?\d+)|(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E))?$/;
const QUANTITY_HELP = 'expected a non-negative integer with an optional suffix (k, M, G, T, Ki, Mi, Gi, Ti, ...), e.g. "5000", "500M", "16Mi", "1Gi"';

function ceilDiv(a: bigint, b: bigint): bigint {
  return (a + b - 1n) / b;
}

/**
 * Parses a Kubernetes quantity ("1k", "500M", "1Gi", "1.5Gi", "1e3", plain numbers) into a
 * non-negative integer. Fractional results round up, as Kubernetes' `Value()` does.
 */
export function parseQuantity(v: string | number): number {
  if (typeof v === 'number') {
    if (!Number.isFinite(v)) throw new Error(`invalid quantity ${v}: must be finite`);
    if (v < 0) throw new Error(`invalid quantity ${v}: must not be negative`);
    const n = Math.ceil(v);
    if (!Number.isSafeInteger(n)) throw new Error(`invalid quantity ${v}: too large`);
    return n;
  }
  if (typeof v !== 'string') throw new Error(`invalid quantity: ${QUANTITY_HELP}`);
  const m = QUANTITY.exec(v.trim());
  if (!m) throw new Error(`invalid quantity "${v}": ${QUANTITY_HELP}`);
  const [, sign, num, exponent, suffix = ''] = m as unknown as [string, string, string, string | undefined, string?];
  if (sign === '-' && /[1-9]/.test(num)) throw new Error(`invalid quantity "${v}": must not be negative`);
  const [intDigits, fracDigits = ''] = num.split('.') as [string, string?];
  const digits = BigInt((intDigits || '0') + fracDigits);
  let numerator = digits;
  let denominator = 10n ** BigInt(fracDigits.length);
  if (suffix in BINARY_SUFFIX_POW) {
    numerator *= 1024n ** BigInt(BINARY_SUFFIX_POW[suffix]!);
  } else {
    const exp10 = exponent !== undefined ? Number(exponent) : DECIMAL_SUFFIX_EXP[suffix]!;
    if (Math.abs(exp10) > 30) throw new Error(`invalid quantity "${v}": exponent out of range`);
    if (exp10 >= 0) numerator *= 10n ** BigInt(exp10);
    else denominator *= 10n ** BigInt(-exp10);
  }
  const value = ceilDiv(numerator, denominator);
  if (value > BigInt(Number.MAX_SAFE_INTEGER)) throw new Error(`invalid quantity "${v}": too large`);
  return Number(value);
}

/** Shortest exact quantity: 16777216 → "16Mi", 1000000000 → "1G", 5000 → "5k", 1234 → "1234". */
export function formatQuantity(n: number): string {
  if (!Number.isSafeInteger(n) || n < 0) throw new Error(`cannot format quantity ${n}`);
  let best = String(n);
  if (n === 0) return best;
  const consider = (text: string): void => {
    if (text.length < best.length) best = text;
  };
  for (const [suffix, pow] of Object.entries(BINARY_SUFFIX_POW)) {
    const unit = 1024 ** pow;
    if (n % unit === 0) consider(`${n / unit}${suffix}`);
  }
  for (const [suffix, exp] of Object.entries(DECIMAL_SUFFIX_EXP)) {
    if (exp <= 0) continue;
    const unit = 10 ** exp;
    if (n % unit === 0) consider(`${n / unit}${suffix}`);
  }
  return best;
}
