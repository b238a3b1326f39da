/**
 * Warn-level lines for events that come in storms (refusals, upstream failures): the news of a
 * spell is logged in full at once, the rest are counted and summed up in one line per window for as
 * long as they go on; a window with none ends the spell. A storm costs a line per window, not one
 * per request, and the event loop does not spend a busy gateway's time writing them.
 *
 * News is the first event of a spell (`perKey: false`), or the first of each key in it (`perKey:
 * true`: the first failure of each endpoint is worth a line of its own).
 */
export class SpellLog {
  private readonly counts = new Map<string, number>();
  private readonly seen = new Set<string>();
  /** Set while a spell lasts: the end of the current window. */
  private timer: NodeJS.Timeout | undefined = undefined;
  private windowStartedAt = 0;

  constructor(
    private readonly windowMs: number,
    private readonly perKey: boolean,
    /** Logs a window's counts (by key). */
    private readonly summarize: (counts: Record<string, number>, total: number, windowMs: number) => void,
  ) {}

  /** An event of `key`: true when it is news (its caller logs it in full), else it is counted. */
  note(key: string): boolean {
    const news = this.perKey ? !this.seen.has(key) : this.timer === undefined;
    if (this.timer === undefined) this.startWindow();
    if (news) {
      this.seen.add(key);
      return true;
    }
    this.counts.set(key, (this.counts.get(key) ?? 0) + 1);
    return false;
  }

  /** Stops the window timer (shutdown), first logging the counts of the window it cuts short. */
  close(): void {
    clearTimeout(this.timer);
    this.timer = undefined;
    this.seen.clear();
    this.logCounts(Date.now() - this.windowStartedAt);
  }

  private startWindow(): void {
    this.windowStartedAt = Date.now();
    this.timer = setTimeout(this.endWindow, this.windowMs);
    this.timer.unref();
  }

  private readonly endWindow = (): void => {
    this.timer = undefined;
    if (this.logCounts(this.windowMs)) this.startWindow();
    // Nothing since the last line: the spell is over, the next event is news again.
    else this.seen.clear();
  };

  /** Logs and clears the counts; false when there were none. */
  private logCounts(windowMs: number): boolean {
    if (this.counts.size === 0) return false;
    let total = 0;
    for (const n of this.counts.values()) total += n;
    this.summarize(Object.fromEntries(this.counts), total, windowMs);
    this.counts.clear();
    return true;
  }
}
