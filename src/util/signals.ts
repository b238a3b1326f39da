/** Graceful stop on SIGINT/SIGTERM (SPEC §1); a second signal exits at once. */
/** Stops on SIGINT/SIGTERM (graceful drain) and exits 0. */
export function stopOnSignals(stop: () => Promise<void>, logger: { info(o: object, m?: string): void; warn(o: object, m?: string): void }) {
  let stopping = false;
  const onSignal = (signal: string) => {
    if (stopping) {
      logger.warn({ signal }, 'second signal: exiting now');
      process.exit(1);
    }
    stopping = true;
    logger.info({ signal }, 'draining');
    stop().then(
      () => process.exit(0),
      () => process.exit(2),
    );
  };
  process.on('SIGINT', () => onSignal('SIGINT'));
  process.on('SIGTERM', () => onSignal('SIGTERM'));
}

