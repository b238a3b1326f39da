/**
 * Preloaded (`node --import tsx --import bench/lib/orphan-guard.ts …`) into every Node process the
 * benchmarks start: exits once the parent is gone, so a bench killed with SIGKILL leaves nothing
 * running. The check is an unref'ed interval: it never keeps the process alive by itself.
 */
const parent = process.ppid;
setInterval(() => {
  if (process.ppid !== parent) process.exit(0);
}, 1000).unref();
