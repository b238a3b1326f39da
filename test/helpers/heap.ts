/** The V8 heap in use after two full collections (gc exposed at run time), for tests that bound what a request keeps. */
import { setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';

setFlagsFromString('--expose-gc');
const gc = runInNewContext('gc') as () => void;

export function heapAfterGc(): number {
  gc();
  gc();
  return process.memoryUsage().heapUsed;
}
