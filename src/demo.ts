/**
 * `sluice demo` / `npm start`: a simulated fleet (the endpoints of the shipped config/demo.yaml,
 * roles labelled) on loopback with the gateway in front, running prefill/decode disaggregation
 * (nixlv2: the gateway runs both legs), and curl lines that show it.
 */
import { fileURLToPath } from 'node:url';
import { startGateway } from './app.js';
import { loadConfigFile } from './config/load.js';
import { builtinRegistry } from './plugins/builtin.js';
import { startSimulator } from './sim/server.js';
import { createLogger } from './util/logger.js';
import { handleSignals } from './util/signals.js';

export const DEMO_CONFIG = fileURLToPath(new URL('../config/demo.yaml', import.meta.url));

export interface DemoOptions {
  port: number;
  metricsPort: number;
  logLevel?: string;
  /** Pretty log lines even where stdout is no terminal (`--log-level LEVEL,pretty`). */
  prettyLogs?: boolean;
  /** Install signal handlers and print the banner (off in tests). */
  interactive?: boolean;
  /**
   * Start the simulated servers on free ports rather than the config's 8101–8104 (which the demo
   * also falls back to when one of those is taken). Tests set it: on a machine whose ephemeral port
   * range starts at 1024, any outgoing connection may hold 8102.
   */
  anyFleetPorts?: boolean;
}

export async function startDemo(opts: DemoOptions) {
  const registry = builtinRegistry();
  const loaded = loadConfigFile(DEMO_CONFIG, registry);
  const logger = createLogger({ level: opts.logLevel ?? 'warn', pretty: opts.prettyLogs });
  const model = 'sim-model';
  const endpoints = loaded.config.pool.endpoints;
  const fleet = (anyPorts: boolean) =>
    startAllOrNone(
      // The Responses API store on, as vLLM's VLLM_ENABLE_RESPONSES_API_STORE=1: a conversation continues by previous_response_id.
      endpoints.map((ep) =>
        startSimulator({ host: ep.address, port: anyPorts ? 0 : ep.port, name: ep.name, model, ttftOverheadMs: 30, itlMs: 25, responsesStore: true }),
      ),
    );
  let anyPorts = opts.anyFleetPorts === true;
  let sims;
  try {
    sims = await fleet(anyPorts);
  } catch (err) {
    // Another program holds one of 8101–8104: the demo's fleet is the demo's own business, any ports do.
    if (anyPorts || (err as NodeJS.ErrnoException).code !== 'EADDRINUSE') throw err;
    logger.warn({ err: (err as Error).message }, 'a port of the simulated fleet is taken: the simulators listen on free ports instead');
    anyPorts = true;
    sims = await fleet(true);
  }
  if (anyPorts) endpoints.forEach((ep, i) => (ep.port = sims[i]!.port));
  let gw;
  try {
    gw = await startGateway(loaded, { logger, registry, port: opts.port, metricsPort: opts.metricsPort, host: '127.0.0.1' });
  } catch (err) {
    await Promise.all(sims.map((s) => s.close()));
    throw err;
  }
  const gateway = gw;
  return {
    gateway,
    sims,
    model,
    async close() {
      await gateway.close();
      await Promise.all(sims.map((s) => s.close()));
    },
  };
}

/**
 * All of the servers, or none: when one fails to start (a busy port), the ones that did are closed
 * before the error is thrown, so nothing is left listening to keep the process alive.
 */
export async function startAllOrNone<T extends { close(): Promise<void> }>(starting: Promise<T>[]): Promise<T[]> {
  const settled = await Promise.allSettled(starting);
  const started = settled.flatMap((r) => (r.status === 'fulfilled' ? [r.value] : []));
  const failed = settled.find((r): r is PromiseRejectedResult => r.status === 'rejected');
  if (!failed) return started;
  // The start failure is what the caller needs to see, whatever closing the others does.
  await Promise.allSettled(started.map((s) => s.close()));
  throw failed.reason;
}

/** A prompt long enough for the demo's prefix-based-pd-decider (nonCachedTokens 64 ≈ 256 characters). */
export const DEMO_LONG_PROMPT =
  'You are a canal keeper. Explain, step by step and in plain words, how a pound lock lets a boat climb ' +
  'from the lower river to the upper basin: the gates, the paddles, the sluices, the water levels, and ' +
  'what the keeper checks before opening anything. Keep it short and friendly for a first-time visitor.';

export async function runDemo(opts: DemoOptions): Promise<void> {
  const signals = handleSignals(createLogger({ level: opts.logLevel ?? 'warn', pretty: opts.prettyLogs }));
  const demo = await startDemo(opts);
  const { gateway, sims, model } = demo;
  const lines = [
    '',
    `Sluice demo: ${sims.length} simulated vLLM servers behind the gateway, prefill/decode disaggregated (nixlv2)`,
    ...demo.gateway.pool.endpoints.map((ep) => `  ${ep.name.padEnd(10)} ${ep.hostPort.padEnd(16)} role=${ep.role || '(none)'}`),
    '',
    'A short prompt is served by a decode pod alone:',
    `  curl -s ${gateway.apiUrl}/v1/chat/completions -H 'content-type: application/json' \\`,
    `    -d '{"model":"${model}","messages":[{"role":"user","content":"Hello!"}]}'`,
    '',
    'A long, new prompt is prefilled on a prefill pod, then decoded (streamed) on a decode pod;',
    'send it twice: the second time the decode pod has it cached and serves it alone:',
    `  curl -sN ${gateway.apiUrl}/v1/chat/completions -H 'content-type: application/json' \\`,
    `    -d '{"model":"${model}","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"${DEMO_LONG_PROMPT}"}]}'`,
    '',
    'Decisions so far:',
    `  curl -s ${gateway.metricsUrl}/metrics | grep ^llm_d_epp_disagg_decision_total`,
    '',
    `Metrics:  ${gateway.metricsUrl}/metrics`,
    `Pool:     ${gateway.metricsUrl}/debug/pool   (roles, stages, in-flight per endpoint)`,
    `Requests: ${gateway.metricsUrl}/debug/requests   (in flight now, oldest first: queued, waiting, streaming)`,
    'Each scheduling decision (filters, scores, pick) and request end in the log: npm start -- --log-level debug',
    '',
    'Ctrl-C stops everything.',
    '',
  ];
  process.stdout.write(lines.join('\n') + '\n');
  signals.ready({ stop: () => demo.close() });
}
