/**
 * `sluice sim [flags]`: argument parsing and the foreground run loop of the simulator.
 *
 * Flags are Sluice's own (`--itl-ms 5`) or llm-d-inference-sim's names for the same settings
 * (`--inter-token-latency 5ms`), so a launch line written for llm-d's simulator runs here too.
 * Each setting may be given once, under either name.
 */
import { createLogger } from '../util/logger.js';
import { parseDuration } from '../config/units.js';
import { ENGINE_DEFAULTS } from './engine.js';
import { SERVER_DEFAULTS, startSimulator, type SimOptions } from './server.js';
import { releaseEarlySignals } from '../util/early-signals.js';
import { UsageError } from '../util/usage.js';

/** The port `sluice sim` listens on without --port (the library's default is an ephemeral port). */
const CLI_PORT = 8000;

type StringKey = 'host' | 'name' | 'model';
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

/**
 * How a flag's value reads: `duration` = a Go duration ("100ms", "1.5s") or integer milliseconds,
 * as llm-d-inference-sim takes them; `percent` = 0–100, stored as a fraction.
 */
type ValueKind = 'integer' | 'number' | 'duration' | 'percent';

interface NumericFlag {
  key: NumericKey;
  kind: ValueKind;
  min: number;
  max?: number;
}

interface OwnFlag {
  spec: NumericFlag | { key: StringKey };
  /** What the value is called in --help. */
  value: string;
  help: string;
  default: string | number;
}

const n = (key: NumericKey, kind: ValueKind, min: number, max?: number): NumericFlag => (max === undefined ? { key, kind, min } : { key, kind, min, max });
const E = ENGINE_DEFAULTS;
const S = SERVER_DEFAULTS;

const OWN_FLAGS: Readonly<Record<string, OwnFlag>> = {
  '--host': { spec: { key: 'host' }, value: 'HOST', help: 'address to listen on', default: S.host },
  '--port': { spec: n('port', 'integer', 0, 65535), value: 'N', help: 'port to listen on (0: any free port)', default: CLI_PORT },
  '--name': { spec: { key: 'name' }, value: 'NAME', help: 'pod name, sent as x-inference-pod', default: 'sim-<port>' },
  '--model': { spec: { key: 'model' }, value: 'MODEL', help: 'the one model served', default: S.model },
  '--max-num-seqs': { spec: n('maxNumSeqs', 'integer', 1), value: 'N', help: 'requests running at once (vLLM --max-num-seqs)', default: E.maxNumSeqs },
  '--max-waiting': { spec: n('maxWaiting', 'integer', 0), value: 'N', help: 'waiting queue; a request beyond it gets 429', default: E.maxWaiting },
  '--ttft-overhead-ms': { spec: n('ttftOverheadMs', 'number', 0), value: 'MS', help: 'time to first token: fixed part', default: E.ttftOverheadMs },
  '--prefill-ms-per-token': { spec: n('prefillMsPerToken', 'number', 0), value: 'MS', help: 'time to first token: per uncached prompt token', default: E.prefillMsPerToken },
  '--itl-ms': { spec: n('itlMs', 'number', 0), value: 'MS', help: 'inter-token latency', default: E.itlMs },
  '--kv-transfer-ms': { spec: n('kvTransferMs', 'number', 0), value: 'MS', help: 'P/D decode leg: KV transfer, fixed part (replaces prefill)', default: E.kvTransferMs },
  '--kv-transfer-ms-per-token': { spec: n('kvTransferMsPerToken', 'number', 0), value: 'MS', help: 'P/D decode leg: KV transfer per uncached prompt token', default: E.kvTransferMsPerToken },
  '--block-size': { spec: n('blockSizeTokens', 'integer', 1), value: 'N', help: 'tokens per KV block (vLLM --block-size)', default: E.blockSizeTokens },
  '--num-gpu-blocks': { spec: n('numGpuBlocks', 'integer', 1), value: 'N', help: 'KV blocks in the prefix cache (LRU; kv_cache_usage_perc)', default: E.numGpuBlocks },
  '--default-output-tokens': { spec: n('defaultOutputTokens', 'integer', 1), value: 'N', help: 'output length when a request sets no max_tokens', default: E.defaultOutputTokens },
  '--max-output-tokens': { spec: n('maxOutputTokens', 'integer', 1), value: 'N', help: 'output length at most', default: E.maxOutputTokens },
  '--max-model-len': { spec: n('maxModelLen', 'integer', 0), value: 'N', help: 'context window in tokens (characters / 4, or token ids); 0 = no limit', default: S.maxModelLen },
  '--failure-rate': { spec: n('failureRate', 'number', 0, 1), value: 'P', help: 'share of requests that fail at random (0–1)', default: S.failureRate },
  '--failure-status': { spec: n('failureStatus', 'integer', 400, 599), value: 'CODE', help: 'HTTP status of those failures', default: S.failureStatus },
};

interface AliasFlag {
  /** Sluice's flag for the same setting. */
  same: string;
  /** How the value reads, when not as `same`'s. */
  spec?: NumericFlag;
  value: string;
  note?: string;
}

/** llm-d-inference-sim's names (its pkg/common/config.go) for settings Sluice's simulator has. */
const LLMD_FLAGS: Readonly<Record<string, AliasFlag>> = {
  '--served-model-name': { same: '--model', value: 'MODEL', note: 'given with --model, the name served is this one (as llm-d)' },
  '--max-waiting-queue-length': { same: '--max-waiting', value: 'N' },
  '--time-to-first-token': {
    same: '--ttft-overhead-ms',
    spec: n('ttftOverheadMs', 'duration', 0),
    value: 'DURATION',
    note: 'a constant time to first token: --prefill-ms-per-token is 0 unless given',
  },
  '--prefill-overhead': { same: '--ttft-overhead-ms', spec: n('ttftOverheadMs', 'duration', 0), value: 'DURATION' },
  '--prefill-time-per-token': { same: '--prefill-ms-per-token', spec: n('prefillMsPerToken', 'duration', 0), value: 'DURATION' },
  '--inter-token-latency': { same: '--itl-ms', spec: n('itlMs', 'duration', 0), value: 'DURATION' },
  '--kv-cache-transfer-latency': { same: '--kv-transfer-ms', spec: n('kvTransferMs', 'duration', 0), value: 'DURATION' },
  '--kv-cache-transfer-time-per-token': { same: '--kv-transfer-ms-per-token', spec: n('kvTransferMsPerToken', 'duration', 0), value: 'DURATION' },
  '--kv-cache-size': { same: '--num-gpu-blocks', value: 'N' },
  '--failure-injection-rate': { same: '--failure-rate', spec: n('failureRate', 'percent', 0, 100), value: 'PERCENT', note: '0–100' },
};

/** llm-d-inference-sim's `--enable-kvcache`: the prefix cache is always modelled here, so only "on" is accepted. */
const ENABLE_KVCACHE = '--enable-kvcache';

/** vLLM's Responses API store, a switch (no value); vLLM's own is its environment variable, read when the flag is absent. */
const ENABLE_RESPONSES_STORE = '--enable-responses-store';
const RESPONSES_STORE_ENV = 'VLLM_ENABLE_RESPONSES_API_STORE';

/** vLLM reads VLLM_ENABLE_RESPONSES_API_STORE as bool(int(value)): "1" on, "0" off, a non-integer fails its start. */
function responsesStoreFromEnv(value: string): boolean {
  const trimmed = value.trim();
  if (!/^[+-]?\d+$/.test(trimmed)) throw new UsageError(`${RESPONSES_STORE_ENV} must be an integer (1: on, 0: off), got ${JSON.stringify(value)}`);
  return Number(trimmed) !== 0;
}

/**
 * Parses `--flag value` and `--flag=value`; throws a UsageError naming the offending flag. `env` is
 * read for VLLM_ENABLE_RESPONSES_API_STORE when --enable-responses-store is absent (runSimCli passes
 * process.env).
 */
export function parseSimArgs(argv: string[], env: Readonly<Record<string, string | undefined>> = {}): SimOptions {
  const opts: SimOptions = {};
  /** Which flag set each option, so a second name for it is an error, not a silent override. */
  const setBy = new Map<string, string>();
  let constantTtft = false;
  let servedModelName: string | undefined;
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i]!;
    const eq = arg.indexOf('=');
    const flag = arg.startsWith('--') && eq > 0 ? arg.slice(0, eq) : arg;
    const inline = flag !== arg ? arg.slice(eq + 1) : undefined;
    if (flag === ENABLE_KVCACHE) {
      if (inline !== undefined && inline !== 'true') throw new UsageError(`${flag}: sluice sim always models the prefix cache (only "true" is accepted)`);
      continue;
    }
    if (flag === ENABLE_RESPONSES_STORE) {
      if (inline !== undefined) throw new UsageError(`${flag} takes no value`);
      if (opts.responsesStore !== undefined) throw new UsageError(`${flag} is given twice`);
      opts.responsesStore = true;
      continue;
    }
    const own = OWN_FLAGS[flag];
    const alias = LLMD_FLAGS[flag];
    if (own === undefined && alias === undefined) {
      throw new UsageError(arg.startsWith('-') ? `unknown flag ${flag} (sluice sim --help lists them)` : `unexpected argument ${arg}`);
    }
    let value: string;
    if (inline !== undefined) value = inline;
    else {
      const next = argv[i + 1];
      if (next === undefined || next.startsWith('--')) throw new UsageError(`${flag} needs a value`);
      value = next;
      i++;
    }
    if (flag === '--served-model-name') {
      // llm-d's --model is the model loaded, --served-model-name the name clients use: that one wins.
      if (servedModelName !== undefined) throw new UsageError(`${flag} is given twice`);
      if (value === '') throw new UsageError(`${flag} must not be empty`);
      servedModelName = value;
      continue;
    }
    const spec = alias?.spec ?? (own ?? OWN_FLAGS[alias!.same]!).spec;
    const earlier = setBy.get(spec.key);
    if (earlier !== undefined) {
      throw new UsageError(earlier === flag ? `${flag} is given twice` : `${flag} sets what ${earlier} already set (give one of them)`);
    }
    setBy.set(spec.key, flag);
    if (flag === '--time-to-first-token') constantTtft = true;
    if ('kind' in spec) opts[spec.key] = parseNumber(flag, value, spec);
    else {
      if (value === '') throw new UsageError(`${flag} must not be empty`);
      // Sent in a header (x-inference-pod) and written into every answer: visible ASCII only.
      if (spec.key === 'name' && !/^[!-~]+$/.test(value)) throw new UsageError(`${flag} must be visible ASCII characters (no spaces), got ${JSON.stringify(value)}`);
      opts[spec.key] = value;
    }
  }
  if (servedModelName !== undefined) opts.model = servedModelName;
  const storeEnv = env[RESPONSES_STORE_ENV];
  if (opts.responsesStore === undefined && storeEnv !== undefined && storeEnv !== '') opts.responsesStore = responsesStoreFromEnv(storeEnv);
  if (constantTtft && opts.prefillMsPerToken === undefined) opts.prefillMsPerToken = 0;
  return opts;
}

/** Plain decimal only, as serve's flags: Number() would also take '0x10', '1e3' and ' 8000'. */
const DECIMAL = /^-?(\d+(\.\d*)?|\.\d+)$/;

function parseNumber(flag: string, raw: string, spec: NumericFlag): number {
  const range = spec.max === undefined ? `≥ ${spec.min}` : `in [${spec.min}, ${spec.max}]`;
  if (spec.kind === 'duration') {
    // llm-d-inference-sim's durations: Go strings, or (deprecated there) integer milliseconds.
    if (/^\d+$/.test(raw)) return Number(raw);
    try {
      return parseDuration(raw);
    } catch (err) {
      throw new UsageError(`${flag}: ${(err as Error).message}, or integer milliseconds`);
    }
  }
  const n = DECIMAL.test(raw) ? Number(raw) : NaN;
  const kind = spec.kind === 'integer' ? 'an integer' : 'a number';
  if (!Number.isFinite(n) || (spec.kind === 'integer' && !Number.isInteger(n)) || n < spec.min || (spec.max !== undefined && n > spec.max)) {
    throw new UsageError(`${flag} must be ${kind} ${range} (got "${raw}")`);
  }
  return spec.kind === 'percent' ? n / 100 : n;
}

/** `sluice sim --help`: every flag with what it sets and its default, from the tables the parser uses. */
export function simUsage(): string {
  const column = (flag: string, value: string): string => `  ${`${flag} ${value}`.padEnd(44)}`;
  const lines = ['usage: sluice sim [flags]   (each as --flag value or --flag=value; each setting once)', ''];
  for (const [flag, f] of Object.entries(OWN_FLAGS)) lines.push(`${column(flag, f.value)}${f.help} [${f.default}]`);
  lines.push(
    `${column(ENABLE_RESPONSES_STORE, '')}keep Responses API answers for previous_response_id (vLLM's ${RESPONSES_STORE_ENV}=1, ` +
      'read when this flag is absent; the newest 10000 kept) [off]',
  );
  lines.push('', "llm-d-inference-sim's flags for the same settings (DURATION: \"100ms\", \"1.5s\", or integer milliseconds):");
  for (const [flag, f] of Object.entries(LLMD_FLAGS)) lines.push(`${column(flag, f.value)}= ${f.same}${f.note === undefined ? '' : `; ${f.note}`}`);
  lines.push(`${column(ENABLE_KVCACHE, '')}accepted; the prefix cache is always modelled`);
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
  const opts = parseSimArgs(argv, process.env);
  const sim = await startSimulator({ port: CLI_PORT, ...opts });
  // Signal handlers first: a signal sent as soon as the line below is read must not meet the default action.
  const stopped = new Promise<void>((resolve) => {
    const stop = (): void => {
      process.off('SIGINT', stop);
      process.off('SIGTERM', stop);
      void sim.close().then(resolve);
    };
    process.on('SIGINT', stop);
    process.on('SIGTERM', stop);
    releaseEarlySignals();
  });
  // The gateway's log format (pino JSON lines), so a pipeline reads a sim fleet's logs as the gateway's.
  createLogger({ level: 'info' }).info({ url: sim.url, name: sim.name, model: opts.model ?? S.model }, 'simulator listening');
  await stopped;
}
