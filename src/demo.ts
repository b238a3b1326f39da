/**
 * `sluice demo` / `npm start`: a simulated fleet (the endpoints of the shipped config/demo.yaml,
 * roles labelled) on loopback with the gateway in front, and a curl line that works.
 */
import { fileURLToPath } from 'node:url';
import { startGateway } from './app.js';
import { loadConfigFile } from './config/load.js';
import { builtinRegistry } from './plugins/builtin.js';
import { startSimulator } from './sim/server.js';
import { createLogger } from './util/logger.js';
import { stopOnSignals } from './util/signals.js';

export const DEMO_CONFIG = fileURLToPath(new URL('../config/demo.yaml', import.meta.url));

export interface DemoOptions {
  port: number;
  metricsPort: number;
  logLevel?: string;
  /** Install signal handlers and print the banner (off in tests). */
  interactive?: boolean;
}

export async function startDemo(opts: DemoOptions) {
  const registry = builtinRegistry();
  const loaded = loadConfigFile(DEMO_CONFIG, registry);
  const logger = createLogger({ level: opts.logLevel ?? 'warn' });
  const model = 'sim-model';
  const sims = await Promise.all(
    loaded.config.pool.endpoints.map((ep) =>
      startSimulator({ host: ep.address, port: ep.port, name: ep.name, model, ttftOverheadMs: 30, itlMs: 25 }),
    ),
  );
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

export async function runDemo(opts: DemoOptions): Promise<void> {
  const demo = await startDemo(opts);
  const { gateway, sims, model } = demo;
  const lines = [
    '',
    `Sluice demo: ${sims.length} simulated vLLM servers behind the gateway`,
    ...demo.gateway.pool.endpoints.map((ep) => `  ${ep.name.padEnd(10)} ${ep.hostPort.padEnd(16)} role=${ep.role || '(none)'}`),
    '',
    'Try it:',
    `  curl -s ${gateway.apiUrl}/v1/chat/completions -H 'content-type: application/json' \\`,
    `    -d '{"model":"${model}","messages":[{"role":"user","content":"Hello!"}]}'`,
    '',
    'Streamed:',
    `  curl -sN ${gateway.apiUrl}/v1/chat/completions -H 'content-type: application/json' \\`,
    `    -d '{"model":"${model}","stream":true,"messages":[{"role":"user","content":"Hello!"}]}'`,
    '',
    `Metrics:  ${gateway.metricsUrl}/metrics`,
    `Pool:     ${gateway.metricsUrl}/debug/pool`,
    '',
    'Ctrl-C stops everything.',
    '',
  ];
  process.stdout.write(lines.join('\n') + '\n');
  stopOnSignals(() => demo.close(), createLogger({ level: opts.logLevel ?? 'warn' }));
}
