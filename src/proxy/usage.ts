/**
 * Token usage read from upstream answers, for metrics: the `usage` object of a JSON answer, or the
 * usage chunk of an SSE stream (`stream_options.include_usage`). The SSE scanner is chunk-boundary
 * safe: a line split across reads (even inside a multi-byte character) is reassembled. The Responses
 * API names its counts `input_tokens`/`output_tokens`, and streams them in the `response` of its
 * `response.completed` event.
 */
import { HeldTail, lastLineEnd } from './held-tail.js';
import { responseIdOf } from './stored-responses.js';

export interface Usage {
  promptTokens: number;
  /** Absent for answers that generate nothing (embeddings): no output-token sample is taken. */
  completionTokens?: number;
  cachedTokens?: number;
}

const numberOr = (a: unknown, b: unknown): number | undefined => (typeof a === 'number' ? a : typeof b === 'number' ? b : undefined);

function usageFrom(obj: unknown): Usage | undefined {
  if (typeof obj !== 'object' || obj === null) return undefined;
  let u = (obj as { usage?: unknown }).usage;
  if (typeof u !== 'object' || u === null) {
    const response = (obj as { response?: unknown }).response;
    if (typeof response !== 'object' || response === null) return undefined;
    u = (response as { usage?: unknown }).usage;
    if (typeof u !== 'object' || u === null) return undefined;
  }
  const counts = u as Record<string, unknown>;
  const promptTokens = numberOr(counts.prompt_tokens, counts.input_tokens);
  if (promptTokens === undefined) return undefined;
  const usage: Usage = { promptTokens };
  const completionTokens = numberOr(counts.completion_tokens, counts.output_tokens);
  if (completionTokens !== undefined) usage.completionTokens = completionTokens;
  const details = (counts.prompt_tokens_details ?? counts.input_tokens_details) as { cached_tokens?: unknown } | null | undefined;
  const cached = details?.cached_tokens;
  if (typeof cached === 'number') usage.cachedTokens = cached;
  return usage;
}

/**
 * Usage of a complete JSON answer; undefined when absent or not JSON. Only the `usage` object is
 * parsed: the last `"usage"` key, when the bytes after its object close the top-level object
 * (usage sits near the end of OpenAI/vLLM answers); anything less certain parses the whole answer.
 */
export function usageFromJson(body: Buffer | string): Usage | undefined {
  const buf = typeof body === 'string' ? Buffer.from(body, 'utf8') : body;
  const tail = usageFromTail(buf);
  if (tail !== UNSURE) return tail;
  try {
    return usageFrom(JSON.parse(buf.toString('utf8')));
  } catch {
    return undefined;
  }
}

const USAGE_KEY = Buffer.from('"usage"', 'latin1');
const UNSURE = Symbol('unsure');
const QUOTE = 0x22;
const BACKSLASH = 0x5c;

function isSpace(b: number): boolean {
  return b === 0x20 || b === 0x0a || b === 0x0d || b === 0x09;
}

/** Index after the string whose opening quote is at `i` (-1 when unterminated). */
function skipString(buf: Buffer, i: number): number {
  for (let k = i + 1; k < buf.length; k++) {
    const b = buf[k]!;
    if (b === BACKSLASH) k++;
    else if (b === QUOTE) return k + 1;
  }
  return -1;
}

/** The top-level usage from the tail of `buf`, undefined when there is none, UNSURE when a full parse must decide. */
function usageFromTail(buf: Buffer): Usage | undefined | typeof UNSURE {
  const at = buf.lastIndexOf(USAGE_KEY);
  if (at < 0) return undefined;
  // An odd run of backslashes before the quote: the match is inside a string.
  let slashes = 0;
  for (let k = at - 1; k >= 0 && buf[k] === BACKSLASH; k--) slashes++;
  if (slashes % 2 === 1) return UNSURE;
  let i = at + USAGE_KEY.length;
  while (i < buf.length && isSpace(buf[i]!)) i++;
  if (buf[i] !== 0x3a /* : */) return UNSURE;
  i++;
  while (i < buf.length && isSpace(buf[i]!)) i++;
  if (buf[i] !== 0x7b /* { */) return UNSURE;
  const start = i;
  // The end of the usage object, then of the enclosing object: only whitespace may follow that.
  let depth = 0;
  let end = -1;
  for (; i < buf.length; i++) {
    const b = buf[i]!;
    if (b === QUOTE) {
      i = skipString(buf, i) - 1;
      if (i < 0) return UNSURE;
    } else if (b === 0x7b || b === 0x5b) depth++;
    else if (b === 0x7d || b === 0x5d) {
      depth--;
      if (depth === 0 && end < 0) end = i + 1;
      else if (depth < 0) break;
    }
  }
  if (end < 0 || depth !== -1 || buf[i] !== 0x7d) return UNSURE;
  for (i++; i < buf.length; i++) if (!isSpace(buf[i]!)) return UNSURE;
  try {
    return usageFrom({ usage: JSON.parse(buf.toString('utf8', start, end)) });
  } catch {
    return UNSURE;
  }
}

const NL = 0x0a;
/** An unfinished line longer than this is dropped, so a stream without newlines cannot grow memory. */
const MAX_HELD_BYTES = 1 << 20;

const ERROR_KEY = Buffer.from('"error"', 'latin1');
const CREATED_KEY = Buffer.from('"response.created"', 'latin1');
/** Unescaped, so never inside a JSON string (a quote there is `\"`): only an event's own member. */
const SEQUENCE_KEY = Buffer.from('"sequence_number":', 'latin1');

/**
 * Feeds SSE bytes as they stream; remembers the last usage seen, and the first error event (vLLM
 * ends a stream that fails after its 200 with `data: {"error": {…, "code": 500}}`). Works on the
 * bytes: only complete lines that mention `"usage"` or `"error"` are decoded and parsed (newlines
 * never occur inside a UTF-8 sequence, so splitting at 0x0a is safe); an unfinished line is held
 * until its newline arrives.
 */
export class SseUsageScanner {
  private readonly lines = new HeldTail(lastLineEnd, 0);
  usage: Usage | undefined = undefined;
  /** The status code of the stream's first error event (500 when it names none). */
  errorCode: number | undefined = undefined;
  /** Responses API streams: the `sequence_number` the next event would carry (the last seen + 1). */
  nextSequenceNumber = 0;
  /**
   * Responses API streams: the id of the response (stored-responses.ts), from its first event
   * (`response.created`, small whatever the answer's size), or else one that carries usage.
   */
  responseId: string | undefined = undefined;

  /** `sequenced`: a Responses API stream, whose events are numbered (an error event Sluice adds follows on). */
  constructor(private readonly sequenced = false) {}

  feed(chunk: Buffer): void {
    const complete = this.lines.push(chunk);
    if (this.lines.length > MAX_HELD_BYTES) this.lines.take();
    if (complete.length === 0) return;
    const lastNl = complete.length - 1;
    this.scanLines(complete, USAGE_KEY, lastNl);
    if (this.errorCode === undefined) this.scanLines(complete, ERROR_KEY, lastNl);
    if (this.sequenced) {
      if (this.responseId === undefined) this.scanLines(complete, CREATED_KEY, lastNl);
      this.lastSequenceNumber(complete);
    }
  }

  private lastSequenceNumber(buf: Buffer): void {
    const at = buf.lastIndexOf(SEQUENCE_KEY);
    if (at < 0) return;
    let i = at + SEQUENCE_KEY.length;
    while (buf[i] === 32) i++;
    let n = 0;
    const start = i;
    for (let c = buf[i]; c !== undefined && c >= 48 && c <= 57 && i - start < 15; c = buf[++i]) n = n * 10 + (c - 48);
    if (i > start) this.nextSequenceNumber = n + 1;
  }

  /** Each complete line of `buf` (up to `lastNl`) that mentions `key`: its usage, or an error event (the first one ends the scan). */
  private scanLines(buf: Buffer, key: Buffer, lastNl: number): void {
    let at = buf.indexOf(key);
    while (at >= 0 && at < lastNl) {
      const end = buf.indexOf(NL, at);
      const text = buf.toString('utf8', buf.lastIndexOf(NL, at) + 1, end);
      if (key === USAGE_KEY) this.line(text);
      else if (key === CREATED_KEY) {
        if (this.createdLine(text)) return;
      } else if (this.errorLine(text)) return;
      at = buf.indexOf(key, end);
    }
  }

  /** A complete line that mentions "response.created": true when it gave the response's id. */
  private createdLine(text: string): boolean {
    if (!text.startsWith('data:')) return false;
    try {
      const event = JSON.parse(text.slice(5)) as { type?: unknown; response?: unknown } | null;
      if (event?.type !== 'response.created') return false;
      this.responseId = responseIdOf(event.response);
      return this.responseId !== undefined;
    } catch {
      return false; // not JSON: a token that says "response.created"
    }
  }

  /** A complete line that mentions "error": true when it is an error event (`data: {"error": {…}}`). */
  private errorLine(text: string): boolean {
    if (!text.startsWith('data:')) return false;
    try {
      const event = JSON.parse(text.slice(5)) as { error?: unknown };
      const error = event?.error;
      if (typeof error !== 'object' || error === null) return false;
      const code = (error as { code?: unknown }).code;
      this.errorCode = typeof code === 'number' && code >= 400 && code <= 599 ? code : 500;
      return true;
    } catch {
      return false; // not JSON: a token that says "error"
    }
  }

  /** A complete line (without its newline) that mentions "usage": a `data:` event's usage, if any. */
  private line(text: string): void {
    if (!text.startsWith('data:')) return;
    let s = 5;
    if (text.charCodeAt(s) === 32) s++;
    if (text.startsWith('[DONE]', s)) return;
    const end = text.length;
    const usageAt = text.indexOf('"usage"', s);
    if (usageAt < 0) return;
    // `"usage":null` on every event (OpenAI-style include_usage): nothing to parse, unless another key follows.
    if (isNullValue(text, usageAt + 7, end) && text.indexOf('"usage"', usageAt + 7) < 0) return;
    let e = end;
    if (text.charCodeAt(e - 1) === 13) e--; // CRLF
    try {
      const event: unknown = JSON.parse(text.slice(s, e));
      const u = usageFrom(event);
      if (u) this.usage = u;
      if (this.sequenced && this.responseId === undefined && typeof event === 'object' && event !== null) {
        this.responseId = responseIdOf((event as { response?: unknown }).response);
      }
    } catch {
      // not JSON: ignore, usage is best effort
    }
  }
}

/** Whether `text` at `i` (after a key) reads `: null` (spaces or tabs allowed). */
function isNullValue(text: string, i: number, end: number): boolean {
  while (i < end && (text.charCodeAt(i) === 32 || text.charCodeAt(i) === 9)) i++;
  if (text.charCodeAt(i) !== 58 /* : */) return false;
  i++;
  while (i < end && (text.charCodeAt(i) === 32 || text.charCodeAt(i) === 9)) i++;
  return text.startsWith('null', i);
}
