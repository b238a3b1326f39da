/**
 * Replaces `usage.prompt_tokens_details.cached_tokens` in a decode answer by the prefill leg's value
 * (nixlv2): the decoder received the whole prompt's KV over NIXL and reports it all as cached,
 * which would mislead clients and dashboards (llm-d routing sidecar, cached-tokens usage rewriter).
 *
 * Only the bytes of that value change (or the member is inserted): the rest of the answer goes out
 * as the server wrote it — numbers such as `1.0` or 20-digit integers, escapes and key order that a
 * parse and re-serialisation would alter. JSON.parse checks the text first, and decides whether
 * anything changes; a usage the member scan cannot place (an escaped key) is re-serialised.
 *
 * JSON answers are rewritten whole. SSE answers are rewritten line by line as they stream: bytes up
 * to the last newline of a chunk go out at once (a line is only parsed when it mentions `"usage"`),
 * an unfinished line is held until its newline arrives, so a usage event split across network reads
 * — even inside a multi-byte character — is reassembled before it is touched. Newlines never occur
 * inside a UTF-8 sequence, so splitting bytes at 0x0a is safe.
 */

import { HeldTail, lastLineEnd } from '../held-tail.js';
import { findMember, skipSpace, type MemberLookup } from '../json-member.js';

const NL = 0x0a;
const CR = 0x0d;
const USAGE = Buffer.from('"usage"', 'utf8');
const LBRACE = 0x7b;
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
  const text = body.toString('utf8');
  let parsed: unknown;
  try {
    parsed = JSON.parse(text);
  } catch {
    return body;
  }
  if (!setCachedTokens(parsed, cachedTokens)) return body;
  return Buffer.from(rewrittenText(text, body.length, parsed, cachedTokens), 'utf8');
}

/**
 * `text` (the UTF-8 decoding of `byteLength` bytes) with the change setCachedTokens made to
 * `parsed`: by editing the bytes of that one value when the member scan places it, else (an escaped
 * key, bytes that were not valid UTF-8 and would not survive the round trip) re-serialised.
 */
function rewrittenText(text: string, byteLength: number, parsed: unknown, n: number): string {
  const spliced = Buffer.byteLength(text, 'utf8') === byteLength ? spliceCachedTokens(text, n) : undefined;
  return spliced ?? JSON.stringify(parsed);
}

/** `text` with `usage.prompt_tokens_details.cached_tokens` set to `n` as setCachedTokens sets it; undefined when not placed. */
function spliceCachedTokens(text: string, n: number): string | undefined {
  const at: MemberLookup = { start: -1, end: -1, close: -1, members: 0 };
  const splice = (start: number, end: number, insert: string): string => text.slice(0, start) + insert + text.slice(end);
  const top = skipSpace(text, 0);
  if (text.charCodeAt(top) !== LBRACE || !findMember(text, top, 'usage', at) || at.start < 0) return undefined;
  const usage = at.start;
  if (text.charCodeAt(usage) !== LBRACE || !findMember(text, usage, 'prompt_tokens_details', at)) return undefined;
  const filled = `{"cached_tokens":${n}}`;
  if (at.start < 0) return splice(at.close, at.close, `${at.members > 0 ? ',' : ''}"prompt_tokens_details":${filled}`);
  if (text.charCodeAt(at.start) !== LBRACE) return splice(at.start, at.end, filled); // null (vLLM's 0)
  const details = at.start;
  if (!findMember(text, details, 'cached_tokens', at)) return undefined;
  if (at.start >= 0) return splice(at.start, at.end, String(n));
  return splice(details + 1, details + 1, `"cached_tokens":${n}${at.members > 0 ? ',' : ''}`);
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
  // `start` is ASCII ("data:" and a space), so the JSON's bytes are the line's bytes past it.
  const rewritten = rewrittenText(json, line.length - start - (cr ? 1 : 0), parsed, cachedTokens);
  return Buffer.from(`${text.slice(0, start)}${rewritten}${cr ? '\r' : ''}`, 'utf8');
}

/** Streaming SSE rewriter: `push` every chunk, send what it returns; `end` flushes the rest. */
export class SseCachedTokensRewriter {
  private readonly lines = new HeldTail(lastLineEnd, 0);

  constructor(private readonly cachedTokens: number) {}

  push(chunk: Buffer): Buffer {
    const complete = this.lines.push(chunk);
    if (complete.length === 0) return this.lines.length > MAX_HELD_BYTES ? this.lines.take() : complete;
    if (complete.indexOf(USAGE) < 0) return complete;
    return this.rewriteLines(complete);
  }

  /** The held-back unfinished line (rewritten when it is a complete usage event). */
  end(): Buffer {
    const rest = this.lines.take();
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
