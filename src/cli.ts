#!/usr/bin/env node
/**
 * The `sluice` entry point: installs the start-up signal handlers (util/early-signals.ts) before
 * loading the rest, which takes a few hundred milliseconds (static imports would load it first).
 * The commands are in cli-main.ts.
 */
import { installEarlySignals } from './util/early-signals.js';

installEarlySignals();
const { runCli } = await import('./cli-main.js');
runCli(process.argv.slice(2));
