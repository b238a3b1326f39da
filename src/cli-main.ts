/**
 * `sluice serve | validate | sim | demo` (SPEC §1). Exit codes: 0 clean stop, 1 bad config or
 * arguments, 2 runtime failure (e.g. port in use). Loaded by the entry point, cli.ts.
 */
import { parseArgs } from 'node:util';
import { readFileSync } from 'node:fs';
import { ConfigError, formatProblem, loadConfigFile } from './config/load.js';
import { effectiveConfigYaml } from './config/print.js';
import { startGateway, type Gateway } from './app.js';
import { builtinRegistry } from './plugins/builtin.js';
import { createLogger, parseLogLevel, type LogSettings } from './util/logger.js';
import { runSimCli, simUsage } from './sim/cli.js';
import { runDemo } from './demo.js';
import { handleSignals } from './util/signals.js';
import { ConfigReloader } from './config/reload.js';
import { UsageError } from './util/usage.js';
import type { Logger } from 'pino';

const USAGE = `usage:
  sluice serve --config FILE [--port N] [--metrics-port N] [--log-level L]
  sluice validate --config FILE
  sluice sim [--port N] [--name NAME] [--model M] [...]
  sluice demo [--port N] [--metrics-port N] [--log-level L]
  sluice version | --version
  sluice help [COMMAND]        (or COMMAND --help: what it does, its flags)

  --config FILE   or SLUICE_CONFIG=FILE
  --log-level L   trace|debug|info|warn|error|fatal|silent, optionally ",pretty" (or LOG_LEVEL=L); JSON lines
                  on stdout, pretty on a terminal
  exit codes      0 clean stop, 1 bad configuration or arguments, 2 runtime failure (e.g. port in use)
  sluice sim --help lists the simulator's flags`;

/** `sluice COMMAND --help` (and `sluice help COMMAND`): what the command does and its flags. */
const COMMAND_HELP: Readonly<Record<string, string>> = {
  serve: `usage: sluice serve --config FILE [--port N] [--metrics-port N] [--log-level L]

Runs the gateway: the OpenAI API on server.port (8080), /metrics, /health, /ready and /debug/* on
server.metricsPort (9090).

  -c, --config FILE    the configuration, YAML or JSON (or SLUICE_CONFIG=FILE); check it with sluice validate
  -p, --port N         the API port, over server.port (0: any free port)
  --metrics-port N     the metrics port, over server.metricsPort
  --log-level L        trace|debug|info|warn|error|fatal|silent, optionally ",pretty" (or LOG_LEVEL=L);
                       debug logs each scheduling decision and each request's end

A change of the file, or SIGHUP, reloads it (a rejected file is logged and the running one kept);
SIGTERM drains for server.shutdownGracePeriod and exits 0; a second one exits at once, 2.
exit codes  0 clean stop, 1 bad configuration or arguments, 2 runtime failure (e.g. port in use)`,
  validate: `usage: sluice validate --config FILE

Prints the effective configuration (every default and auto-injection) as YAML on stdout and exits 0;
warnings go to stderr as FILE:LINE:COL: path: message (warning). A file with problems prints each as
FILE:LINE:COL: path: message on stderr and exits 1.

  -c, --config FILE    (or SLUICE_CONFIG=FILE)`,
  demo: `usage: sluice demo [--port N] [--metrics-port N] [--log-level L]

Four simulated vLLM servers (on 8101-8104, or on free ports when one is taken) and the gateway in
front, all on 127.0.0.1, with prefill/decode disaggregation (config/demo.yaml); prints curl lines to
try. Ctrl-C stops it.

  -p, --port N         the API port (8080)
  --metrics-port N     the metrics port (9090)
  --log-level L        as for serve (default warn; debug logs each scheduling decision)`,
  version: `usage: sluice version   (or sluice --version)

Prints the version of Sluice (package.json's).`,
};

function intFlag(v: string | undefined, name: string): number | undefined {
  if (v === undefined) return undefined;
  // Digits only: Number() would read '' as 0 (any free port) and accept '0x1F90' or '1e3'.
  const n = /^\d{1,5}$/.test(v) ? Number(v) : NaN;
  if (!(n <= 65535)) throw new UsageError(`--${name} must be a port number (0-65535), got '${v}'`);
  return n;
}

/** `--log-level`, else `LOG_LEVEL` (see parseLogLevel): a typo is a usage error (exit 1), not a crash. */
function logLevelFlag(v: string | undefined): LogSettings {
  try {
    return parseLogLevel(v ?? process.env.LOG_LEVEL);
  } catch (err) {
    throw new UsageError(`${v !== undefined ? '--log-level' : 'LOG_LEVEL'} ${(err as Error).message}`);
  }
}

type Flag = 'config' | 'port' | 'metrics-port' | 'log-level';

const FLAG_OPTIONS = {
  config: { type: 'string', short: 'c' },
  port: { type: 'string', short: 'p' },
  'metrics-port': { type: 'string' },
  'log-level': { type: 'string' },
} as const;

/** The command's flags (`--help` always); any other flag, even one another command takes, is a usage error. */
function parse(command: string, argv: string[], allowed: readonly Flag[]): Partial<Record<Flag, string>> & { help?: boolean } {
  const options: Record<string, (typeof FLAG_OPTIONS)[Flag] | { type: 'boolean'; short: 'h' }> = { help: { type: 'boolean', short: 'h' } };
  for (const f of allowed) options[f] = FLAG_OPTIONS[f];
  try {
    return parseArgs({ args: argv, options, strict: true, allowPositionals: false }).values as Partial<Record<Flag, string>> & { help?: boolean };
  } catch (err) {
    // `sluice validate FILE`: say how the file is given.
    const stray = (err as { code?: string }).code === 'ERR_PARSE_ARGS_UNEXPECTED_POSITIONAL' ? /'([^']*)'/.exec((err as Error).message)?.[1] : undefined;
    const hint = stray !== undefined && allowed.includes('config') ? ` (the configuration file is given as --config ${stray})` : '';
    throw new UsageError(`${command}: ${(err as Error).message}${hint}`);
  }
}

/** The API and metrics ports (flags over config) must differ: it would fail at listen (exit 2); it is an argument error (1). */
function checkPortsDiffer(port: number | undefined, metricsPort: number | undefined, config: { port: number; metricsPort: number }): void {
  const api = port ?? config.port;
  if (api !== 0 && api === (metricsPort ?? config.metricsPort)) {
    throw new UsageError(`the API port and the metrics port must differ (both ${api}: see --port, --metrics-port and the config's server.port, server.metricsPort)`);
  }
}

function loadOrExit(file: string | undefined, registry = builtinRegistry()) {
  const path = file ?? process.env.SLUICE_CONFIG;
  if (!path) throw new UsageError('--config FILE is required (or set SLUICE_CONFIG)');
  return loadConfigFile(path, registry);
}

/**
 * A throw nothing caught (a bug) ends the process as Node would, but as SPEC §1's runtime failure
 * (exit 2; Node's own 1 means bad configuration here) and with a log line a log pipeline can read.
 */
function exitOnCrash(logger: Logger): void {
  const crash = (what: string) => (err: unknown) => {
    logger.fatal({ err }, `${what}: exiting`);
    process.exit(2);
  };
  process.on('uncaughtException', crash('uncaught exception'));
  process.on('unhandledRejection', crash('unhandled promise rejection'));
}

async function main(argv: string[]): Promise<number> {
  let [command, ...rest] = argv;
  if (command === 'help') {
    const topic = rest[0] ?? '';
    if (topic !== '' && topic !== 'sim' && !Object.hasOwn(COMMAND_HELP, topic)) throw new UsageError(`help: unknown command '${topic}'\n${USAGE}`);
    console.log(topic === 'sim' ? simUsage() : (COMMAND_HELP[topic] ?? USAGE));
    return 0;
  }
  if (command === undefined || (command.startsWith('-') && command !== '--version')) {
    if (command === '--help' || command === '-h') {
      console.log(USAGE);
      return 0;
    }
    // Bare `sluice` serves SLUICE_CONFIG (as the image does); without one, someone is finding out how to start.
    if (command === undefined && !process.env.SLUICE_CONFIG) throw new UsageError(`no command given\n${USAGE}`);
    rest = command === undefined ? [] : argv;
    command = 'serve';
  }
  switch (command) {
    case 'serve': {
      const flags = parse(command, rest, ['config', 'port', 'metrics-port', 'log-level']);
      if (flags.help) {
        console.log(COMMAND_HELP.serve);
        return 0;
      }
      const port = intFlag(flags.port, 'port');
      const metricsPort = intFlag(flags['metrics-port'], 'metrics-port');
      const logging = logLevelFlag(flags['log-level']);
      const registry = builtinRegistry();
      const loaded = loadOrExit(flags.config, registry);
      checkPortsDiffer(port, metricsPort, loaded.config.server);
      const logger = createLogger(logging);
      exitOnCrash(logger);
      const signals = handleSignals(logger, { hangup: true }); // before 'listening' is logged
      let gw: Gateway;
      try {
        gw = await startGateway(loaded, { logger, registry, port, metricsPort });
      } catch (err) {
        logger.fatal({ err: (err as Error).message }, 'could not start the gateway');
        return 2;
      }
      const reloader = new ConfigReloader({
        file: loaded.file,
        registry,
        target: gw,
        logger,
        onResult: (result) => gw.metrics.configReload(result),
      });
      reloader.start();
      signals.ready({
        stop: () => {
          reloader.stop();
          return gw.close();
        },
        reload: () => void reloader.reloadNow('SIGHUP'),
      });
      return -1; // keep running
    }
    case 'validate': {
      const flags = parse(command, rest, ['config']);
      if (flags.help) {
        console.log(COMMAND_HELP.validate);
        return 0;
      }
      const loaded = loadOrExit(flags.config);
      for (const w of loaded.warnings) process.stderr.write(`${formatProblem(w)} (warning)\n`);
      process.stdout.write(effectiveConfigYaml(loaded));
      return 0;
    }
    case 'sim':
      await runSimCli(rest); // resolves once SIGINT/SIGTERM closed the simulator
      return 0;
    case 'demo': {
      const flags = parse(command, rest, ['port', 'metrics-port', 'log-level']);
      if (flags.help) {
        console.log(COMMAND_HELP.demo);
        return 0;
      }
      const port = intFlag(flags.port, 'port') ?? 8080;
      const metricsPort = intFlag(flags['metrics-port'], 'metrics-port') ?? 9090;
      checkPortsDiffer(port, metricsPort, { port: 0, metricsPort: 0 });
      const logging = logLevelFlag(flags['log-level']);
      await runDemo({ port, metricsPort, logLevel: logging.level, prettyLogs: logging.pretty });
      return -1;
    }
    case 'version':
    case '--version': {
      if (parse('version', rest, []).help) {
        console.log(COMMAND_HELP.version);
        return 0;
      }
      const pkg = JSON.parse(readFileSync(new URL('../package.json', import.meta.url), 'utf8')) as { version: string };
      console.log(pkg.version);
      return 0;
    }
    default:
      throw new UsageError(`unknown command '${command}'\n${USAGE}`);
  }
}

/**
 * Exits once what was written to stdout and stderr has been handed over: writes to a pipe are
 * asynchronous, and `process.exit` would drop all but what the pipe holds (64 KiB) when its reader
 * is slower than us (`sluice validate … | less`).
 */
function exitWhenWritten(code: number): void {
  let pending = 2;
  const done = (): void => {
    if (--pending === 0) process.exit(code);
  };
  process.stdout.write('', done);
  process.stderr.write('', done);
}

/** Runs a command and exits with its code (a server keeps the process running). */
export function runCli(argv: string[]): void {
  main(argv).then(
    (code) => {
      if (code >= 0) exitWhenWritten(code);
    },
    (err: unknown) => {
      if (err instanceof ConfigError) {
        process.stderr.write(err.format() + '\n');
        return exitWhenWritten(1);
      }
      if (err instanceof UsageError) {
        process.stderr.write(`sluice: ${err.message}\n`);
        return exitWhenWritten(1);
      }
      const e = err as NodeJS.ErrnoException;
      process.stderr.write(`sluice: ${e?.message ?? String(err)}\n`);
      exitWhenWritten(2);
    },
  );
}
