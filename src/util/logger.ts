/** pino JSON logs on stdout; pretty only on a TTY or when asked (SPEC §1). */
import pino, { type Logger } from 'pino';

export function createLogger(opts: { level?: string; pretty?: boolean } = {}): Logger {
  const level = opts.level ?? process.env.LOG_LEVEL ?? 'info';
  const pretty = opts.pretty ?? process.stdout.isTTY === true;
  if (pretty) {
    return pino({ level, transport: { target: 'pino-pretty', options: { colorize: true, translateTime: 'SYS:HH:MM:ss.l' } } });
  }
  return pino({ level });
}

export const silentLogger: Logger = pino({ level: 'silent' });
