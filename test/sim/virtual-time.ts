/** A clock and timer facility driven by hand, so engine tests never sleep. */
import type { Clock } from '../../src/util/clock.js';
import type { SimTimers } from '../../src/sim/engine.js';

interface PendingTimer {
  at: number;
  seq: number;
  callback: () => void;
  cancelled: boolean;
}

export class VirtualTime implements Clock, SimTimers {
  private t = 1_000_000;
  private seq = 0;
  private pending: PendingTimer[] = [];

  now(): number {
    return this.t;
  }

  set(callback: () => void, delayMs: number): PendingTimer {
    const timer = { at: this.t + Math.max(0, delayMs), seq: this.seq++, callback, cancelled: false };
    this.pending.push(timer);
    return timer;
  }

  clear(handle: unknown): void {
    (handle as PendingTimer).cancelled = true;
  }

  /** Runs every timer due within `ms`, in due order, moving the clock to each due time. */
  advance(ms: number): void {
    const end = this.t + ms;
    for (;;) {
      const next = this.nextDue();
      if (next === undefined || next.at > end) break;
      this.pending.splice(this.pending.indexOf(next), 1);
      this.t = next.at;
      next.callback();
    }
    this.t = end;
  }

  /** Runs timers until none is left (bounded, to catch runaway loops). */
  runAll(limit = 100_000): void {
    for (let i = 0; i < limit; i++) {
      const next = this.nextDue();
      if (next === undefined) return;
      this.advance(next.at - this.t);
    }
    throw new Error('timers did not settle');
  }

  get pendingCount(): number {
    return this.pending.filter((p) => !p.cancelled).length;
  }

  private nextDue(): PendingTimer | undefined {
    this.pending = this.pending.filter((p) => !p.cancelled);
    let best: PendingTimer | undefined;
    for (const p of this.pending) {
      if (!best || p.at < best.at || (p.at === best.at && p.seq < best.seq)) best = p;
    }
    return best;
  }
}
