/**
 * A small, strict parser for the Prometheus text exposition format (0.0.4), as written by the Go
 * client, the Python client (floats like `3.0`, `_created` series) and prom-client (Node).
 *
 * One pass over the string with charCode comparisons — no regex per line — because every endpoint is
 * scraped every 50 ms. With a `wanted` filter, a line whose metric name is not wanted is skipped right
 * after its name is read (its name is still checked, so an HTML or JSON page fails on its first line);
 * only wanted lines are fully validated and materialised. Lines of `lazy` metrics are validated but
 * passed by value and position; their labels are built only when asked for (`labelsAt`).
 *
 * Malformed input throws `PromParseError` with the 1-based line number: a garbage page must fail the
 * scrape, never silently read as zeros.
 */

export interface Sample {
  name: string;
  labels: Record<string, string>;
  value: number;
}

export type NameFilter = (name: string) => boolean;
export type SampleCallback = (name: string, labels: Record<string, string>, value: number) => void;

/**
 * Metrics whose lines are checked and passed by value and position, their labels built only on
 * request (`labelsAt`). For a family of many series of which one is wanted (vLLM's
 * `vllm:lora_requests_info` keeps one per adapter combination it ever ran: tens of thousands on a
 * long-running LoRA server), building every label set cost most of the scrape. A lazy line is
 * checked as any other, except for a label named twice, which only `labelsAt` finds.
 */
export interface LazySamples {
  names: NameFilter;
  /** `at`: where the line starts, and `line` its number, for `labelsAt`. */
  onSample: (name: string, value: number, at: number, line: number) => void;
}

/** The labels of the sample line starting at `at` (line number `line`) of a text `forEachSample` read. */
export function labelsAt(text: string, at: number, line: number): Record<string, string> {
  let labels: Record<string, string> | undefined;
  let eol = text.indexOf('\n', at);
  if (eol === -1) eol = text.length;
  try {
    forEachSample(text.slice(at, eol), undefined, (_name, l) => {
      labels = l;
    });
  } catch (err) {
    // Read alone, the line is line 1: the page's number is the one to report.
    if (err instanceof PromParseError) throw new PromParseError(line, err.reason);
    throw err;
  }
  if (labels === undefined) throw new Error(`no sample line at ${at}`);
  return labels;
}

const SKIP = 0;
const READ = 1;
const LAZY = 2;

export class PromParseError extends Error {
  readonly line: number;
  readonly reason: string;
  constructor(line: number, reason: string) {
    super(`metrics text line ${line}: ${reason}`);
    this.name = 'PromParseError';
    this.line = line;
    this.reason = reason;
  }
}

const CR = 13;
const SPACE = 32;
const TAB = 9;
const HASH = 35; // #
const OPEN_BRACE = 123; // {
const CLOSE_BRACE = 125; // }
const EQUALS = 61; // =
const QUOTE = 34; // "
const BACKSLASH = 92; // \
const COMMA = 44; // ,
const COLON = 58; // :
const UNDERSCORE = 95; // _
const LOWER_N = 110; // n

function isBlank(c: number): boolean {
  return c === SPACE || c === TAB;
}

function isLetter(c: number): boolean {
  return (c >= 97 && c <= 122) || (c >= 65 && c <= 90);
}

function isDigit(c: number): boolean {
  return c >= 48 && c <= 57;
}

function isLabelNameStart(c: number): boolean {
  return isLetter(c) || c === UNDERSCORE;
}

function isLabelNameChar(c: number): boolean {
  return isLetter(c) || isDigit(c) || c === UNDERSCORE;
}

function isMetricNameStart(c: number): boolean {
  return isLabelNameStart(c) || c === COLON;
}

function isMetricNameChar(c: number): boolean {
  return isLabelNameChar(c) || c === COLON;
}

/** Printable description of the character at `i` for error messages. */
function describeChar(text: string, i: number, end: number): string {
  return i >= end ? 'end of line' : JSON.stringify(text[i]);
}

/**
 * Sample value as Go's ParseFloat accepts it in practice: decimal/exponent floats, `+Inf`, `-Inf`,
 * `Inf`, `NaN` (case-insensitive). Returns undefined when the token is not a number. Hex and `Infinity`
 * spellings that JS `Number()` would also accept are rejected by the character check.
 */
export function parseSampleValue(token: string): number | undefined {
  const first = token.charCodeAt(0);
  const second = token.charCodeAt(1);
  if (isLetter(first) || ((first === 43 || first === 45) && isLetter(second))) {
    switch (token.toLowerCase()) {
      case 'inf':
      case '+inf':
        return Infinity;
      case '-inf':
        return -Infinity;
      case 'nan':
        return NaN;
      default:
        return undefined;
    }
  }
  let sawDigit = false;
  for (let k = 0; k < token.length; k++) {
    const c = token.charCodeAt(k);
    if (isDigit(c)) sawDigit = true;
    // digits . + - e E
    else if (c !== 46 && c !== 43 && c !== 45 && c !== 101 && c !== 69) return undefined;
  }
  if (!sawDigit) return undefined;
  const v = Number(token);
  return Number.isNaN(v) ? undefined : v;
}

function isIntegerToken(text: string, start: number, end: number): boolean {
  let k = start;
  if (k < end && text.charCodeAt(k) === 45) k++; // leading '-'
  if (k === end) return false;
  for (; k < end; k++) if (!isDigit(text.charCodeAt(k))) return false;
  return true;
}

/**
 * Calls `onSample` for every sample line whose metric name passes `wanted` (all lines when omitted),
 * in page order. Comments (`# HELP`, `# TYPE`, anything after `#`) and blank lines are skipped; LF and
 * CRLF line endings both work; optional timestamps are validated and ignored.
 */
export function forEachSample(text: string, wanted: NameFilter | undefined, onSample: SampleCallback, lazy?: LazySamples): void {
  const n = text.length;
  let pos = 0;
  let lineNo = 0;
  // Consecutive lines usually share a name (histogram buckets, engine series): reuse the last name and
  // verdict without scanning or slicing again.
  let prevName = '';
  let prevWanted = SKIP;

  while (pos < n) {
    lineNo++;
    let eol = text.indexOf('\n', pos);
    if (eol === -1) eol = n;
    let end = eol;
    if (end > pos && text.charCodeAt(end - 1) === CR) end--;
    const lineStart = pos;
    pos = eol + 1;

    let i = lineStart;
    while (i < end && isBlank(text.charCodeAt(i))) i++;
    if (i === end) continue; // blank line
    let c = text.charCodeAt(i);
    if (c === HASH) continue; // HELP, TYPE and plain comments carry nothing we need

    // Metric name. Fast path: the same name as the previous sample line, followed by '{' or a blank.
    let name: string;
    let want: number;
    const nameStart = i;
    const afterPrev = i + prevName.length;
    if (
      prevName.length > 0 &&
      afterPrev < end &&
      (text.charCodeAt(afterPrev) === OPEN_BRACE || isBlank(text.charCodeAt(afterPrev))) &&
      text.startsWith(prevName, i)
    ) {
      name = prevName;
      want = prevWanted;
      i = afterPrev;
    } else {
      if (!isMetricNameStart(c)) throw new PromParseError(lineNo, `invalid metric name start ${describeChar(text, i, end)}`);
      i++;
      while (i < end && isMetricNameChar(text.charCodeAt(i))) i++;
      if (i === end) throw new PromParseError(lineNo, 'missing value after metric name');
      c = text.charCodeAt(i);
      if (c !== OPEN_BRACE && !isBlank(c)) {
        throw new PromParseError(lineNo, `unexpected ${describeChar(text, i, end)} after metric name`);
      }
      name = text.slice(nameStart, i);
      want = lazy !== undefined && lazy.names(name) ? LAZY : wanted === undefined || wanted(name) ? READ : SKIP;
      prevName = name;
      prevWanted = want;
    }
    if (want === SKIP) continue;

    while (i < end && isBlank(text.charCodeAt(i))) i++;

    // Label set: a lazy line's is checked but not built.
    const labels: Record<string, string> | undefined = want === READ ? {} : undefined;
    if (i < end && text.charCodeAt(i) === OPEN_BRACE) {
      i = labels === undefined ? checkLabelSet(text, i + 1, end, lineNo) : readLabelSet(text, i + 1, end, lineNo, labels);
      while (i < end && isBlank(text.charCodeAt(i))) i++;
    }

    // Value.
    const valueStart = i;
    while (i < end && !isBlank(text.charCodeAt(i))) i++;
    if (i === valueStart) throw new PromParseError(lineNo, `missing value for ${name}`);
    const token = text.slice(valueStart, i);
    const sampleValue = parseSampleValue(token);
    if (sampleValue === undefined) throw new PromParseError(lineNo, `invalid value ${JSON.stringify(token)} for ${name}`);

    // Optional timestamp (integer milliseconds), then nothing but blanks.
    while (i < end && isBlank(text.charCodeAt(i))) i++;
    if (i < end) {
      const tsStart = i;
      while (i < end && !isBlank(text.charCodeAt(i))) i++;
      if (!isIntegerToken(text, tsStart, i)) {
        throw new PromParseError(lineNo, `invalid timestamp ${JSON.stringify(text.slice(tsStart, i))} for ${name}`);
      }
      while (i < end && isBlank(text.charCodeAt(i))) i++;
      if (i < end) throw new PromParseError(lineNo, `unexpected text after timestamp: ${JSON.stringify(text.slice(i, end))}`);
    }

    if (labels !== undefined) onSample(name, labels, sampleValue);
    else lazy!.onSample(name, sampleValue, lineStart, lineNo);
  }
}

/**
 * A well-formed label set, from just after its `{` to its `}` (one regex run: V8 compiles it to machine
 * code, several times faster than the loop below over a long line). Values cannot span lines.
 */
const LABEL_SET = /(?:[ \t]*[a-zA-Z_][a-zA-Z0-9_]*[ \t]*=[ \t]*"(?:[^"\\\n]|\\[\\"n])*"[ \t]*,)*(?:[ \t]*[a-zA-Z_][a-zA-Z0-9_]*[ \t]*=[ \t]*"(?:[^"\\\n]|\\[\\"n])*"[ \t]*)?[ \t]*\}/y;

/** Checks a label set without building it; the loop below names what is wrong with a malformed one. */
function checkLabelSet(text: string, i: number, end: number, lineNo: number): number {
  LABEL_SET.lastIndex = i;
  if (LABEL_SET.test(text) && LABEL_SET.lastIndex <= end) return LABEL_SET.lastIndex;
  return readLabelSet(text, i, end, lineNo, undefined);
}

/**
 * Reads a label set from just after its `{` to just after its `}`, into `labels` when given (else
 * only checked: no string is built). Returns the index after the `}`.
 */
function readLabelSet(text: string, i: number, end: number, lineNo: number, labels: Record<string, string> | undefined): number {
  for (;;) {
    while (i < end && isBlank(text.charCodeAt(i))) i++;
    if (i >= end) throw new PromParseError(lineNo, 'unterminated label set');
    let c = text.charCodeAt(i);
    if (c === CLOSE_BRACE) return i + 1;
    if (!isLabelNameStart(c)) throw new PromParseError(lineNo, `invalid label name start ${describeChar(text, i, end)}`);
    const labelStart = i;
    i++;
    while (i < end && isLabelNameChar(text.charCodeAt(i))) i++;
    const labelEnd = i;
    while (i < end && isBlank(text.charCodeAt(i))) i++;
    if (i >= end || text.charCodeAt(i) !== EQUALS) {
      throw new PromParseError(lineNo, `expected '=' after label ${text.slice(labelStart, labelEnd)}, got ${describeChar(text, i, end)}`);
    }
    i++;
    while (i < end && isBlank(text.charCodeAt(i))) i++;
    if (i >= end || text.charCodeAt(i) !== QUOTE) {
      throw new PromParseError(lineNo, `expected '"' to open the value of label ${text.slice(labelStart, labelEnd)}, got ${describeChar(text, i, end)}`);
    }
    i++;
    // Label value: copy runs between escapes.
    let value = '';
    let segStart = i;
    for (;;) {
      if (i >= end) throw new PromParseError(lineNo, `unterminated value of label ${text.slice(labelStart, labelEnd)}`);
      c = text.charCodeAt(i);
      if (c === QUOTE) break;
      if (c === BACKSLASH) {
        const next = i + 1 < end ? text.charCodeAt(i + 1) : -1;
        let unescaped: string;
        if (next === BACKSLASH) unescaped = '\\';
        else if (next === QUOTE) unescaped = '"';
        else if (next === LOWER_N) unescaped = '\n';
        else throw new PromParseError(lineNo, `invalid escape sequence in value of label ${text.slice(labelStart, labelEnd)}`);
        if (labels !== undefined) value += text.slice(segStart, i) + unescaped;
        i += 2;
        segStart = i;
        continue;
      }
      i++;
    }
    if (labels !== undefined) {
      value += text.slice(segStart, i);
      const labelName = text.slice(labelStart, labelEnd);
      if (Object.prototype.hasOwnProperty.call(labels, labelName)) {
        throw new PromParseError(lineNo, `duplicate label ${labelName}`);
      }
      if (labelName === '__proto__') {
        Object.defineProperty(labels, labelName, { value, enumerable: true, writable: true, configurable: true });
      } else {
        labels[labelName] = value;
      }
    }
    i++; // closing quote
    while (i < end && isBlank(text.charCodeAt(i))) i++;
    if (i >= end) throw new PromParseError(lineNo, 'unterminated label set');
    c = text.charCodeAt(i);
    if (c === COMMA) {
      i++; // a trailing comma before '}' is allowed, as in the Go parser
      continue;
    }
    if (c !== CLOSE_BRACE) {
      throw new PromParseError(lineNo, `expected ',' or '}' after label ${text.slice(labelStart, labelEnd)}, got ${describeChar(text, i, end)}`);
    }
    return i + 1;
  }
}

/** Array form of `forEachSample` (tests, tooling; the scraper uses the callback form). */
export function parsePromText(text: string, wanted?: NameFilter): { samples: Sample[] } {
  const samples: Sample[] = [];
  forEachSample(text, wanted, (name, labels, value) => {
    samples.push({ name, labels, value });
  });
  return { samples };
}
