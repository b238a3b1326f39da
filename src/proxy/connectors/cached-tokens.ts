/**
 * Replaces `usage.prompt_tokens_details.cached_tokens` in a decode answer by the prefill leg's value
 * (nixlv2): the decoder received the whole prompt's KV over NIXL and reports it all as cached,
 * which would mislead clients and dashboards (llm-d routing sidecar, cached-tokens usage rewriter).
 *
 * Only the bytes of that value change (or the member is inserted): the rest of the answer goes out
 * as the server wrote it — numbers such as `1.0` or 20-digit integers, escapes and key order that a
 * parse and re-serialisation would alter. JSON.parse checks the text first, and decides whether
 * anything changes; a usage the byte scan cannot place falls back to re-serialising.
 *
 * JSON answers are rewritten whole. SSE answers are rewritten line by line as they stream: bytes up
 * to the last newline of a chunk go out at once (a line is only parsed when it mentions `"usage"`),
 * an unfinished line is held until its newline arrives, so a usage event split across network reads
 * — even inside a multi-byte character — is reassembled before it is touched. Newlines never occur
 * inside a UTF-8 sequence, so splitting bytes at 0x0a is safe.
 */

const NL = 0x0a;
const CR = 0x0d;
const USAGE = Buffer.from('"usage"', 'utf8');
const EMPTY = Buffer.alloc(0);
/** A "line" longer than this without a newline is not SSE we understand: passed on untouched. */
const MAX_HELD_BYTES = 1 << 20;

/**
 * Sets the cached-token count of a parsed answer or chunk in place. Returns whether it changed
 * anything: no `usage` object → nothing; `prompt_tokens_details` absent or null is only filled in
 * when the value is > 0 (vLLM sends null for 0).
 */
export function setCachedTokens(answer: unknown, cachedTokens: number): boolean {
  if (typeof answer !== 'object' || answer === null) return false;
  const usage = (answer as { usage?: unknown }).usage;
  if (typeof usage !== 'object' || usage === null) return false;
  const u = usage as Record<string, unknown>;
  const details = u.prompt_tokens_details;
  if (typeof details === 'object' && details !== null && !Array.isArray(details)) {
    (details as Record<string, unknown>).cached_tokens = cachedTokens;
    return true;
  }
  if (cachedTokens > 0) {
    u.prompt_tokens_details = { cached_tokens: cachedTokens };
    return true;
  }
  return false;
}

/** A complete JSON answer with the value replaced; the input itself when there is nothing to change. */
export function rewriteJsonCachedTokens(body: Buffer, cachedTokens: number): Buffer {
  if (body.indexOf(USAGE) < 0) return body;
  let parsed: unknown;
  try {
    parsed = JSON.parse(body.toString('utf8'));
  } catch {
    return body;
  }
  if (!setCachedTokens(parsed, cachedTokens)) return body;
  return spliceCachedTokens(body, cachedTokens) ?? Buffer.from(JSON.stringify(parsed), 'utf8');
}

// --- the byte scan: spans of JSON values in a text JSON.parse has accepted

const QUOTE = 0x22;
const BACKSLASH = 0x5c;
const OPEN = new Set([0x7b, 0x5b]); // { [
const CLOSE = new Set([0x7d, 0x5d]); // } ]
const LBRACE = 0x7b;
const COLON = 0x3a;
const COMMA = 0x2c;

const isSpace = (b: number | undefined): boolean => b === 0x20 || b === 0x0a || b === 0x0d || b === 0x09;

function skipSpace(buf: Buffer, i: number): number {
  while (i < buf.length && isSpace(buf[i])) i++;
  return i;
}

/** Index after the JSON value starting at `i`. */
function valueEnd(buf: Buffer, i: number): number {
  const b = buf[i]!;
  if (b === QUOTE) return stringEnd(buf, i);
  if (OPEN.has(b)) {
    let depth = 0;
    for (let k = i; k < buf.length; k++) {
      const c = buf[k]!;
      if (c === QUOTE) k = stringEnd(buf, k) - 1;
      else if (OPEN.has(c)) depth++;
      else if (CLOSE.has(c) && --depth === 0) return k + 1;
    }
    return buf.length;
  }
  let k = i;
  while (k < buf.length && buf[k] !== COMMA && !CLOSE.has(buf[k]!) && !isSpace(buf[k])) k++;
  return k;
}

function stringEnd(buf: Buffer, i: number): number {
  for (let k = i + 1; k < buf.length; k++) {
    if (buf[k] === BACKSLASH) k++;
    else if (buf[k] === QUOTE) return k + 1;
  }
  return buf.length;
}

interface ObjectSpan {
  /** Index of the closing brace. */
  close: number;
  members: number;
  /** The last member with each key (as written, quotes included), as JSON.parse keeps the last. */
  values: Map<string, { start: number; end: number }>;
}

/** The members of the object whose `{` is at `open`. */
function objectAt(buf: Buffer, open: number): ObjectSpan {
  const values = new Map<string, { start: number; end: number }>();
  let members = 0;
  let i = skipSpace(buf, open + 1);
  while (buf[i] === QUOTE) {
    const keyEnd = stringEnd(buf, i);
    // Keys compare as JSON.parse reads them: an escaped one ("us\u0061ge") is decoded first.
    let key = buf.toString('latin1', i, keyEnd);
    if (key.includes('\\')) key = JSON.stringify(JSON.parse(buf.toString('utf8', i, keyEnd)));
    const start = skipSpace(buf, skipSpace(buf, keyEnd) + 1); // past the colon
    const end = valueEnd(buf, start);
    values.set(key, { start, end });
    members++;
    i = skipSpace(buf, end);
    if (buf[i] === COMMA) i = skipSpace(buf, i + 1);
  }
  return { close: i, members, values };
}

function splice(buf: Buffer, start: number, end: number, text: string): Buffer {
  return Buffer.concat([buf.subarray(0, start), Buffer.from(text, 'latin1'), buf.subarray(end)]);
}

/**
 * `text` with `usage.prompt_tokens_details.cached_tokens` set to `n` by editing only its bytes,
 * as setCachedTokens edits the parsed form; undefined when the scan cannot place it.
 */
function spliceCachedTokens(text: Buffer, n: number): Buffer | undefined {
  const first = skipSpace(text, 0);
  if (text[first] !== LBRACE) return undefined;
  const usage = objectAt(text, first).values.get('"usage"');
  if (usage === undefined || text[usage.start] !== LBRACE) return undefined;
  const u = objectAt(text, usage.start);
  const details = u.values.get('"prompt_tokens_details"');
  if (details !== undefined && text[details.start] === LBRACE) {
    const d = objectAt(text, details.start);
    const cached = d.values.get('"cached_tokens"');
    if (cached !== undefined) return splice(text, cached.start, cached.end, String(n));
    return splice(text, details.start + 1, details.start + 1, `"cached_tokens":${n}${d.members > 0 ? ',' : ''}`);
  }
  const filled = `{"cached_tokens":${n}}`;
  if (details !== undefined) return splice(text, details.start, details.end, filled);
  return splice(text, u.close, u.close, `${u.members > 0 ? ',' : ''}"prompt_tokens_details":${filled}`);
}

/** One SSE line (without its newline) rewritten, or undefined when it stays as it is. */
function rewriteLine(line: Buffer, cachedTokens: number): Buffer | undefined {
  if (line.indexOf(USAGE) < 0) return undefined;
  const text = line.toString('utf8');
  if (!text.startsWith('data:')) return undefined;
  let start = 5;
  if (text.charCodeAt(start) === 32) start++;
  const cr = text.charCodeAt(text.length - 1) === CR;
  const json = text.slice(start, cr ? -1 : undefined);
  if (json === '[DONE]') return undefined;
  let parsed: unknown;
  try {
    parsed = JSON.parse(json);
  } catch {
    return undefined;
  }
  if (!setCachedTokens(parsed, cachedTokens)) return undefined;
  const head = Buffer.byteLength(text.slice(0, start), 'utf8');
  const spliced = spliceCachedTokens(line.subarray(head, cr ? line.length - 1 : line.length), cachedTokens);
  if (spliced !== undefined) return Buffer.concat([line.subarray(0, head), spliced, cr ? line.subarray(line.length - 1) : EMPTY]);
  return Buffer.from(`${text.slice(0, start)}${JSON.stringify(parsed)}${cr ? '\r' : ''}`, 'utf8');
}

/** Streaming SSE rewriter: `push` every chunk, send what it returns; `end` flushes the rest. */
export class SseCachedTokensRewriter {
  private held: Buffer = EMPTY;

  constructor(private readonly cachedTokens: number) {}

  push(chunk: Buffer): Buffer {
    const buf = this.held.length === 0 ? chunk : Buffer.concat([this.held, chunk]);
    const lastNl = buf.lastIndexOf(NL);
    if (lastNl < 0) {
      if (buf.length > MAX_HELD_BYTES) {
        this.held = EMPTY;
        return buf;
      }
      this.held = buf;
      return EMPTY;
    }
    // Copy the remainder: `chunk` belongs to the HTTP client and may be reused after this turn.
    this.held = lastNl + 1 < buf.length ? Buffer.from(buf.subarray(lastNl + 1)) : EMPTY;
    const complete = lastNl + 1 === buf.length ? buf : buf.subarray(0, lastNl + 1);
    if (complete.indexOf(USAGE) < 0) return complete;
    return this.rewriteLines(complete);
  }

  /** The held-back unfinished line (rewritten when it is a complete usage event). */
  end(): Buffer {
    const rest = this.held;
    this.held = EMPTY;
    if (rest.length === 0) return rest;
    return rewriteLine(rest, this.cachedTokens) ?? rest;
  }

  private rewriteLines(complete: Buffer): Buffer {
    const parts: Buffer[] = [];
    let start = 0;
    let copiedTo = 0;
    while (start < complete.length) {
      const nl = complete.indexOf(NL, start);
      const line = complete.subarray(start, nl);
      const rewritten = rewriteLine(line, this.cachedTokens);
      if (rewritten !== undefined) {
        if (copiedTo < start) parts.push(complete.subarray(copiedTo, start));
        parts.push(rewritten);
        copiedTo = nl; // the newline itself is copied with the next untouched span
      }
      start = nl + 1;
    }
    if (parts.length === 0) return complete;
    if (copiedTo < complete.length) parts.push(complete.subarray(copiedTo));
    return Buffer.concat(parts);
  }
}
