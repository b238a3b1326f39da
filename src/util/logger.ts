/** pino JSON logs on stdout; pretty only on a TTY or when asked (SPEC §1). */
import pino, { type Logger } from 'pino';

export function createLogger(opts: { level?: string; pretty?: boolean } = {}): Logger {
  const level = opts.level ?? process.env.LOG_LEVEL ?? 'info';
  const pretty = opts.pretty ?? process.stdout.isTTY === true;
  if (pretty) {
    // Colours only on a terminal: `,pretty` into a file or a pipe stays readable there.
    return pino({ level, transport: { target: 'pino-pretty', options: { colorize: process.stdout.isTTY === true, translateTime: 'SYS:HH:MM:ss.l' } } });
  }
  return pino({ level });
}

export interface LogSettings {
  level?: string;
  pretty?: true;
}

const LOG_LEVELS = [...Object.keys(pino.levels.values), 'silent'];

/**
 * A `--log-level` value: a pino level, optionally with `,pretty` (`debug,pretty`; `pretty` alone is
 * info) for pretty lines where stdout is no terminal. Throws "must be …" naming the choices.
 */
export function parseLogLevel(given: string | undefined): LogSettings {
  if (given === undefined) return {};
  const parts = given.split(',');
  const pretty = parts.includes('pretty');
  const levels = parts.filter((p) => p !== 'pretty');
  const level = levels[0] ?? 'info';
  if (levels.length <= 1 && parts.length - levels.length <= 1 && LOG_LEVELS.includes(level)) return pretty ? { level, pretty } : { level };
  throw new Error(`must be one of ${LOG_LEVELS.join(', ')}, optionally with ',pretty' (or 'pretty' alone), got '${given}'`);
}

export const silentLogger: Logger = pino({ level: 'silent' });
