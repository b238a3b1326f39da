/**
 * Live reload (SPEC §3.7): on SIGHUP (`reloadNow`, wired in `util/signals.ts`) or a change of the
 * config file, parse and validate it; an invalid file is logged problem by problem and the running
 * configuration keeps serving; a valid one is applied without dropping queued or in-flight requests.
 * The file is polled (stat every second) rather than watched with inotify: a Kubernetes ConfigMap
 * update swaps a symlink, which `fs.watch` on the file misses, while `stat` follows it.
 */
import { unwatchFile, watchFile, type Stats } from 'node:fs';
import { isDeepStrictEqual } from 'node:util';
import type { Logger } from 'pino';
import type { PluginRegistry } from '../plugins/registry.js';
import { ConfigError, loadConfigText, readConfigFile, type LoadResult } from './load.js';
import type { SluiceConfig } from './types.js';

export interface ReloadTarget {
  /** The configuration in force (a file that loads to the same is not applied again). */
  readonly config: SluiceConfig;
  reload(next: LoadResult): Promise<void>;
}

export type ReloadResult = 'applied' | 'rejected' | 'in-force';

export interface ConfigReloaderOptions {
  file: string;
  registry: PluginRegistry;
  target: ReloadTarget;
  logger: Logger;
  /**
   * Told the result of every attempt (metrics): applied, rejected, or `in-force` when the file is
   * valid and gives the configuration already running (nothing applied, e.g. a bad edit reverted).
   */
  onResult?: (result: ReloadResult) => void;
  /** How often the file is polled; default 1000 ms. 0 disables file watching. */
  pollIntervalMs?: number;
}

/**
 * A trigger whose file gives the same verdict as the last one (e.g. an edit followed by SIGHUP, both
 * triggers of one change) is logged once at info and not counted: nothing was applied or rejected anew.
 */
export class ConfigReloader {
  private running: Promise<boolean> | undefined;
  private again = false;
  /** The problems of the last rejected file, until a file loads. */
  private lastRejected: string | undefined;
  private readonly onFileChange = (cur: Stats, prev: Stats) => {
    if (cur.mtimeMs !== prev.mtimeMs || cur.size !== prev.size || cur.ino !== prev.ino) void this.reloadNow('file change');
  };

  constructor(private readonly opts: ConfigReloaderOptions) {}

  start(): void {
    const interval = this.opts.pollIntervalMs ?? 1000;
    if (interval > 0) watchFile(this.opts.file, { interval, persistent: false }, this.onFileChange);
  }

  stop(): void {
    unwatchFile(this.opts.file, this.onFileChange);
  }

  /** One reload at a time; a trigger during a reload runs one more afterwards. Resolves true when the file's configuration is in force. */
  reloadNow(trigger: string): Promise<boolean> {
    if (this.running) {
      this.again = true;
      return this.running;
    }
    this.running = this.attempt(trigger).finally(() => {
      this.running = undefined;
      if (this.again) {
        this.again = false;
        void this.reloadNow(trigger);
      }
    });
    return this.running;
  }

  private async attempt(trigger: string): Promise<boolean> {
    const { logger, file } = this.opts;
    let next: LoadResult;
    try {
      next = loadConfigText(readConfigFile(file), file, this.opts.registry);
      // Valid at start (every default, no endpoints), but on a reload most likely a file caught
      // half-written (truncated, then written) or emptied by a templating step: applied, it would
      // take every endpoint away.
      if (next.empty === true) {
        throw new ConfigError([{ file, line: 1, col: 1, path: '', message: 'the file sets nothing (empty, only comments, or an empty document): not applied on a reload, since it would remove every endpoint; restart to run with no configuration' }]);
      }
    } catch (err) {
      const problems = err instanceof ConfigError ? err.format().split('\n') : [(err as Error).message];
      const text = problems.join('\n');
      if (text === this.lastRejected) {
        logger.info({ file, trigger }, 'config reload: the file has the same problems as when it was last rejected; the previous configuration keeps serving');
        return false;
      }
      this.lastRejected = text;
      for (const problem of problems) logger.error({ file, problem }, 'config reload rejected');
      logger.error({ file, trigger, problems: problems.length }, 'config reload rejected: the previous configuration keeps serving');
      this.opts.onResult?.('rejected');
      return false;
    }
    this.lastRejected = undefined;
    if (isDeepStrictEqual(next.config, this.opts.target.config)) {
      logger.info({ file, trigger }, 'config reload: the file gives the configuration in force; nothing to apply');
      this.opts.onResult?.('in-force');
      return true;
    }
    try {
      await this.opts.target.reload(next);
    } catch (err) {
      logger.error({ file, trigger, err: (err as Error).message }, 'config reload could not be applied: the previous configuration keeps serving');
      this.opts.onResult?.('rejected');
      return false;
    }
    logger.info({ file, trigger }, 'config reload applied');
    this.opts.onResult?.('applied');
    return true;
  }
}
