/**
 * Preloaded into a gateway under measurement (`node --expose-gc --import tsx --import
 * bench/lib/mem-probe.ts …`, BENCH_MEM_FILE set): on SIGUSR2 it runs a full GC twice and writes
 * `{rss, heapUsed, heapTotal, external, arrayBuffers}` (bytes) to BENCH_MEM_FILE, so the bench can
 * read memory without garbage in it. Bench-only: nothing in src/ knows about it.
 */
import { renameSync, writeFileSync } from 'node:fs';

const file = process.env.BENCH_MEM_FILE;
const gc = (globalThis as { gc?: () => void }).gc;
if (file !== undefined && file !== '') {
  process.on('SIGUSR2', () => {
    gc?.();
    gc?.();
    const m = process.memoryUsage();
    const tmp = `${file}.tmp`;
    writeFileSync(tmp, JSON.stringify({ at: Date.now(), gc: gc !== undefined, rss: m.rss, heapUsed: m.heapUsed, heapTotal: m.heapTotal, external: m.external, arrayBuffers: m.arrayBuffers }));
    renameSync(tmp, file);
  });
}
