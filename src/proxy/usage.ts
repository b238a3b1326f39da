/**
 * Token usage read from upstream answers, for metrics: the `usage` object of a JSON answer, or the
 * usage chunk of an SSE stream (`stream_options.include_usage`). The SSE scanner is chunk-boundary
 * safe: a line split across reads (even inside a multi-byte character) is reassembled.
 */
import { StringDecoder } from 'node:string_decoder';

export interface Usage {
  promptTokens: number;
  completionTokens: number;
  cachedTokens?: number;
}

function usageFrom(obj: unknown): Usage | undefined {
  if (typeof obj !== 'object' || obj === null) return undefined;
  const u = (obj as { usage?: unknown }).usage;
  if (typeof u !== 'object' || u === null) return undefined;
  const { prompt_tokens, completion_tokens, prompt_tokens_details } = u as Record<string, unknown>;
  if (typeof prompt_tokens !== 'number') return undefined;
  const usage: Usage = {
    promptTokens: prompt_tokens,
    completionTokens: typeof completion_tokens === 'number' ? completion_tokens : 0,
  };
  const cached = (prompt_tokens_details as { cached_tokens?: unknown } | null | undefined)?.cached_tokens;
  if (typeof cached === 'number') usage.cachedTokens = cached;
  return usage;
}

/** Usage of a complete JSON answer; undefined when absent or not JSON. */
export function usageFromJson(body: Buffer | string): Usage | undefined {
  try {
    return usageFrom(JSON.parse(typeof body === 'string' ? body : body.toString('utf8')));
  } catch {
    return undefined;
  }
}

/** Feeds SSE bytes as they stream; remembers the last usage seen. */
export class SseUsageScanner {
  private readonly decoder = new StringDecoder('utf8');
  private partial = '';
  usage: Usage | undefined = undefined;
  /** Number of `data:` events seen (excluding [DONE]). */
  events = 0;

  feed(chunk: Buffer): void {
    const text = this.partial + this.decoder.write(chunk);
    let start = 0;
    for (;;) {
      const nl = text.indexOf('\n', start);
      if (nl < 0) break;
      this.line(text, start, nl);
      start = nl + 1;
    }
    // Keep only the unfinished line; bound it so a stream without newlines cannot grow memory.
    this.partial = start < text.length ? text.slice(start) : '';
    if (this.partial.length > 1 << 20) this.partial = '';
  }

  private line(text: string, start: number, end: number): void {
    if (!text.startsWith('data:', start)) return;
    let s = start + 5;
    if (text.charCodeAt(s) === 32) s++;
    if (text.startsWith('[DONE]', s)) return;
    this.events++;
    const usageAt = text.indexOf('"usage"', s);
    if (usageAt < 0 || usageAt >= end) return;
    let e = end;
    if (text.charCodeAt(e - 1) === 13) e--; // CRLF
    try {
      const u = usageFrom(JSON.parse(text.slice(s, e)));
      if (u) this.usage = u;
    } catch {
      // not JSON: ignore, usage is best effort
    }
  }
}
