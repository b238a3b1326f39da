/**
 * Sluice's own refusals (a 429 or 503 carrying `x-llm-d-request-dropped-reason`) at warn level, so
 * an operator sees them without debug logging: the first of each kind in a spell at once, with its
 * message, then one summary per window (counts by kind) for as long as refusals go on (SpellLog).
 * A kind is the reason and the message without its per-request detail: `rejected-saturated` alone
 * is a full queue, a profile whose filters left no endpoint, or a sheddable request refused, and
 * only the message tells them apart. Only refused requests reach it, never the served ones.
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
    this.spells = new SpellLog(windowMs, true, (refused, total, ms) =>
      logger.warn({ refused, total, windowMs: ms }, 'requests refused by the gateway in the last window'),
    );
  }

  /** `cause`: the message without its per-request detail (SentError.cause), the same for every refusal of its kind. */
  note(reason: DroppedReason, status: number, requestId: string, message: string, cause = message): void {
    if (this.spells.note(`${reason}: ${cause}`)) {
      this.logger.warn({ droppedReason: reason, status, requestId, error: message, summaryEveryMs: this.windowMs }, 'the gateway is refusing requests');
    }
  }

  /** Stops the window timer (shutdown), first logging the counts of the window it cuts short. */
  close(): void {
    this.spells.close();
  }
}
