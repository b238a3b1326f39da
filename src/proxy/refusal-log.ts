/**
 * Sluice's own refusals (a 429 or 503 carrying `x-llm-d-request-dropped-reason`) at warn level, so
 * an operator sees them without debug logging: the first of a quiet spell at once, then one summary
 * per window (counts by reason) for as long as refusals go on (SpellLog). Only refused requests
 * reach it, never the served ones.
 */
import type { Logger } from 'pino';
import type { DroppedReason } from './errors.js';
import { SpellLog } from './spell-log.js';

export class RefusalLog {
  private readonly spells: SpellLog;

  constructor(
    private readonly logger: Logger,
    private readonly windowMs = 30_000,
  ) {
    this.spells = new SpellLog(windowMs, false, (refused, total, ms) =>
      logger.warn({ refused, total, windowMs: ms }, 'requests refused by the gateway in the last window'),
    );
  }

  note(reason: DroppedReason, status: number, requestId: string): void {
    if (this.spells.note(reason)) {
      this.logger.warn({ droppedReason: reason, status, requestId, summaryEveryMs: this.windowMs }, 'the gateway is refusing requests');
    }
  }

  /** Stops the window timer (shutdown), first logging the counts of the window it cuts short. */
  close(): void {
    this.spells.close();
  }
}
