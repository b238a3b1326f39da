/**
 * Preloaded into a gateway under measurement (`node --expose-gc --import tsx --import
 * bench/lib/mem-probe.ts …`, BENCH_MEM_FILE set): on SIGUSR2 it runs a full GC twice, waits for the
 * RSS to settle and writes `{rss, heapUsed, heapTotal, external, arrayBuffers}` (bytes) to
 * BENCH_MEM_FILE, so the bench can read memory without garbage in it. Bench-only: nothing in src/
 * knows about it.
 *
 * Why wait: V8 hands the pages a GC freed back to the system from a background thread after the GC
 * returns. An RSS read at once still counts them: 5–25 MB more than a second later, varying from
 * snapshot to snapshot, which alone decided whether the soak's "no growth" was met.
 */
import { renameSync, writeFileSync } from 'node:fs';

const file = process.env.BENCH_MEM_FILE;
const gc = (globalThis as { gc?: () => void }).gc;
/** Settled: two reads this far apart differ by less than SETTLED_BYTES; at most SETTLE_MAX_MS. */
const SETTLE_STEP_MS = 250;
const SETTLE_MAX_MS = 5000;
const SETTLED_BYTES = 256 * 1024;

async function settledRss(): Promise<void> {
  let last = process.memoryUsage.rss();
  for (let waited = 0; waited < SETTLE_MAX_MS; waited += SETTLE_STEP_MS) {
    await new Promise((resolve) => setTimeout(resolve, SETTLE_STEP_MS));
    const now = process.memoryUsage.rss();
    if (Math.abs(now - last) < SETTLED_BYTES) return;
    last = now;
  }
}

if (file !== undefined && file !== '') {
  process.on('SIGUSR2', () => {
    gc?.();
    gc?.();
    void settledRss().then(() => {
      const m = process.memoryUsage();
      const tmp = `${file}.tmp`;
      writeFileSync(tmp, JSON.stringify({ at: Date.now(), gc: gc !== undefined, rss: m.rss, heapUsed: m.heapUsed, heapTotal: m.heapTotal, external: m.external, arrayBuffers: m.arrayBuffers }));
      renameSync(tmp, file);
    });
  });
}
