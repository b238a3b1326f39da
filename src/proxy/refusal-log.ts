/**
 * Sluice's own refusals (a 429 or 503 carrying `x-llm-d-request-dropped-reason`) at warn level, so
 * an operator sees them without debug logging: the first of a quiet spell at once, then one summary
 * per window (counts by reason) for as long as refusals go on. A storm costs one line per window,
 * not one per request. Only refused requests reach it, never the served ones.
 */
import type { Logger } from 'pino';
import type { DroppedReason } from './errors.js';

export class RefusalLog {
  private readonly counts = new Map<DroppedReason, number>();
  /** Set while a spell lasts: the end of the current window. */
  private timer: NodeJS.Timeout | undefined = undefined;

  constructor(
    private readonly logger: Logger,
    private readonly windowMs = 30_000,
  ) {}

  note(reason: DroppedReason, status: number, requestId: string): void {
    if (this.timer === undefined) {
      this.logger.warn({ droppedReason: reason, status, requestId, summaryEveryMs: this.windowMs }, 'the gateway is refusing requests');
      this.startWindow();
      return;
    }
    this.counts.set(reason, (this.counts.get(reason) ?? 0) + 1);
  }

  /** Stops the window timer (shutdown), first logging the counts of the window it cuts short. */
  close(): void {
    clearTimeout(this.timer);
    this.timer = undefined;
    this.logCounts(Date.now() - this.windowStartedAt);
  }

  private windowStartedAt = 0;

  private startWindow(): void {
    this.windowStartedAt = Date.now();
    this.timer = setTimeout(this.endWindow, this.windowMs);
    this.timer.unref();
  }

  private readonly endWindow = (): void => {
    this.timer = undefined;
    // No refusal since the last line: the spell is over, the next refusal is news again.
    if (this.logCounts(this.windowMs)) this.startWindow();
  };

  /** Logs and clears the counts; false when there were none. */
  private logCounts(windowMs: number): boolean {
    if (this.counts.size === 0) return false;
    let total = 0;
    for (const n of this.counts.values()) total += n;
    this.logger.warn({ refused: Object.fromEntries(this.counts), total, windowMs }, 'requests refused by the gateway in the last window');
    this.counts.clear();
    return true;
  }
}
