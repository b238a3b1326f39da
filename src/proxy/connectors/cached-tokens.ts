/**
 * Replaces `usage.prompt_tokens_details.cached_tokens` in a decode answer by the prefill leg's value
 * (nixlv2): the decoder received the whole prompt's KV over NIXL and reports it all as cached,
 * which would mislead clients and dashboards (llm-d routing sidecar, cached-tokens usage rewriter).
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
  return setCachedTokens(parsed, cachedTokens) ? Buffer.from(JSON.stringify(parsed), 'utf8') : body;
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
