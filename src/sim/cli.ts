/** `sluice sim [flags]`: argument parsing and the foreground run loop of the simulator. */
import { startSimulator, type SimOptions } from './server.js';
import { UsageError } from '../util/usage.js';

type NumericKey =
  | 'port'
  | 'maxNumSeqs'
  | 'maxWaiting'
  | 'ttftOverheadMs'
  | 'prefillMsPerToken'
  | 'itlMs'
  | 'kvTransferMs'
  | 'kvTransferMsPerToken'
  | 'blockSizeTokens'
  | 'numGpuBlocks'
  | 'defaultOutputTokens'
  | 'maxOutputTokens'
  | 'maxModelLen'
  | 'failureRate'
  | 'failureStatus';

interface NumericFlag {
  key: NumericKey;
  integer: boolean;
  min: number;
  max?: number;
}

const NUMERIC_FLAGS: Readonly<Record<string, NumericFlag>> = {
  '--port': { key: 'port', integer: true, min: 0, max: 65535 },
  '--max-num-seqs': { key: 'maxNumSeqs', integer: true, min: 1 },
  '--max-waiting': { key: 'maxWaiting', integer: true, min: 0 },
  '--ttft-overhead-ms': { key: 'ttftOverheadMs', integer: false, min: 0 },
  '--prefill-ms-per-token': { key: 'prefillMsPerToken', integer: false, min: 0 },
  '--itl-ms': { key: 'itlMs', integer: false, min: 0 },
  '--kv-transfer-ms': { key: 'kvTransferMs', integer: false, min: 0 },
  '--kv-transfer-ms-per-token': { key: 'kvTransferMsPerToken', integer: false, min: 0 },
  '--block-size': { key: 'blockSizeTokens', integer: true, min: 1 },
  '--num-gpu-blocks': { key: 'numGpuBlocks', integer: true, min: 1 },
  '--default-output-tokens': { key: 'defaultOutputTokens', integer: true, min: 1 },
  '--max-output-tokens': { key: 'maxOutputTokens', integer: true, min: 1 },
  '--max-model-len': { key: 'maxModelLen', integer: true, min: 0 },
  '--failure-rate': { key: 'failureRate', integer: false, min: 0, max: 1 },
  '--failure-status': { key: 'failureStatus', integer: true, min: 400, max: 599 },
};

const STRING_FLAGS: Readonly<Record<string, 'host' | 'name' | 'model'>> = {
  '--host': 'host',
  '--name': 'name',
  '--model': 'model',
};

/** Parses `--flag value` and `--flag=value`; throws a UsageError naming the offending flag. */
export function parseSimArgs(argv: string[]): SimOptions {
  const opts: SimOptions = {};
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i]!;
    const eq = arg.indexOf('=');
    const flag = arg.startsWith('--') && eq > 0 ? arg.slice(0, eq) : arg;
    const numeric = NUMERIC_FLAGS[flag];
    const stringKey = STRING_FLAGS[flag];
    if (numeric === undefined && stringKey === undefined) {
      throw new UsageError(arg.startsWith('-') ? `unknown flag ${flag}` : `unexpected argument ${arg}`);
    }
    let value: string;
    if (flag !== arg) value = arg.slice(eq + 1);
    else {
      const next = argv[i + 1];
      if (next === undefined || next.startsWith('--')) throw new UsageError(`${flag} needs a value`);
      value = next;
      i++;
    }
    if (stringKey !== undefined) {
      if (value === '') throw new UsageError(`${flag} must not be empty`);
      opts[stringKey] = value;
    } else if (numeric !== undefined) {
      opts[numeric.key] = parseNumber(flag, value, numeric);
    }
  }
  return opts;
}

/** Plain decimal only, as serve's flags: Number() would also take '0x10', '1e3' and ' 8000'. */
const DECIMAL = /^-?(\d+(\.\d*)?|\.\d+)$/;

function parseNumber(flag: string, raw: string, spec: NumericFlag): number {
  const n = DECIMAL.test(raw) ? Number(raw) : NaN;
  const kind = spec.integer ? 'an integer' : 'a number';
  const range = spec.max === undefined ? `≥ ${spec.min}` : `in [${spec.min}, ${spec.max}]`;
  if (!Number.isFinite(n) || (spec.integer && !Number.isInteger(n)) || n < spec.min || (spec.max !== undefined && n > spec.max)) {
    throw new UsageError(`${flag} must be ${kind} ${range} (got "${raw}")`);
  }
  return n;
}

/** `sluice sim --help`: every flag with what it accepts, from the tables the parser uses. */
export function simUsage(): string {
  const lines = ['usage: sluice sim [flags]   (each as --flag value or --flag=value)'];
  for (const [flag, key] of Object.entries(STRING_FLAGS)) lines.push(`  ${flag.padEnd(28)} ${key}`);
  for (const [flag, spec] of Object.entries(NUMERIC_FLAGS)) {
    const range = spec.max === undefined ? `≥ ${spec.min}` : `${spec.min}–${spec.max}`;
    lines.push(`  ${flag.padEnd(28)} ${spec.integer ? 'integer' : 'number'} ${range}`);
  }
  return lines.join('\n');
}

/**
 * Starts the simulator, logs one JSON line with its URL, and resolves once SIGINT/SIGTERM have
 * closed it (so a caller can `await` it and then exit). Bad arguments throw before listening;
 * `--help` prints the flags and starts nothing.
 */
export async function runSimCli(argv: string[]): Promise<void> {
  if (argv.includes('--help') || argv.includes('-h')) {
    console.log(simUsage());
    return;
  }
  const opts = parseSimArgs(argv);
  const sim = await startSimulator({ port: 8000, ...opts });
  // Signal handlers first: a signal sent as soon as the line below is read must not meet the default action.
  const stopped = new Promise<void>((resolve) => {
    const stop = (): void => {
      process.off('SIGINT', stop);
      process.off('SIGTERM', stop);
      void sim.close().then(resolve);
    };
    process.on('SIGINT', stop);
    process.on('SIGTERM', stop);
  });
  console.log(JSON.stringify({
    level: 'info',
    msg: 'simulator listening',
    url: sim.url,
    name: sim.name,
    model: opts.model ?? 'sim-model',
  }));
  await stopped;
}
