// An agent outside Python that trains the model behind it: the `openai` npm package against the
// serve-mode proxy, plus one feedback call and one commit per episode (docs/serve.md).
//
// Task: the arithmetic of `make demo-llm` ("What is $63 + 2$? Give the final answer as a LaTeX
// \boxed{} expression."), in two turns: the model answers, the agent asks it to check its work, and
// the agent scores the final answer itself: 1 boxed and right, 0.5 right but not boxed, 0.1 boxed
// and wrong, 0 otherwise. Each training step runs BATCH questions x GROUP episodes (one session
// each, the question's id as task id: a GRPO group), then sends rewards and commits. Held-out
// accuracy is measured through the same endpoint, greedy, and is never committed.
//
// Pacing (--max-lag L): step s starts once the proxy serves version s - 1 - L, i.e. the weights trained
// on all but the last L steps' episodes (L = 0: on-policy, 1: one step off-policy, as sync_offset 1).
// Without it an agent that samples faster than the trainer trains runs ahead, and its episodes are
// trained many versions after the weights that sampled them. -1: never wait (a deployed agent's traffic).
//
// Usage: node agent.js --url URL --data DIR [--token T] [--steps 20] [--batch 8] [--group 8]
//        [--heldout 64] [--eval-every 5] [--max-tokens 64] [--temperature 0.7] [--seed 0] [--out FILE]
//        [--max-lag 1] [--eval-step N] (only one evaluation, recorded as step N)
// Prints one JSON line per step and per evaluation; --out appends the evaluations as eval records
// ({"time", "step", "model_version", "scores"}) for summary.json and `trinity plot`.
'use strict';
const { randomUUID } = require('crypto');
const fs = require('fs');
const path = require('path');
const { default: OpenAI } = require('openai');

const FOLLOW_UP = 'Check your work. Reply with the final answer as a LaTeX \\boxed{} expression.';

function options(argv) {
  const opts = {
    steps: 20, batch: 8, group: 8, heldout: 64, evalEvery: 5, maxTokens: 64, seed: 0, temperature: 0.7, evalStep: -1,
    maxLag: 1,
  };
  for (let i = 2; i < argv.length; i += 2) {
    const key = argv[i].replace(/^--/, '').replace(/-([a-z])/g, (_, c) => c.toUpperCase());
    if (!(key in opts) && !['url', 'data', 'token', 'out'].includes(key)) throw new Error(`unknown option ${argv[i]}`);
    opts[key] = typeof opts[key] === 'number' ? Number(argv[i + 1]) : argv[i + 1];
  }
  if (!opts.url || !opts.data) throw new Error('give --url (the proxy) and --data (train.jsonl, heldout.jsonl)');
  return opts;
}

function readRows(file) {
  return fs.readFileSync(file, 'utf8').split('\n').filter(Boolean).map((line, i) => ({ id: i, ...JSON.parse(line) }));
}

// A seeded shuffle (mulberry32), so two runs with one seed see the questions in one order.
function shuffled(rows, seed) {
  let s = seed >>> 0;
  const rand = () => {
    s = (s + 0x6d2b79f5) >>> 0;
    let t = Math.imul(s ^ (s >>> 15), 1 | s);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
  const out = rows.slice();
  for (let i = out.length - 1; i > 0; i--) {
    const j = Math.floor(rand() * (i + 1));
    [out[i], out[j]] = [out[j], out[i]];
  }
  return out;
}

function score(reply, answer) {
  const boxed = [...(reply || '').matchAll(/\\boxed\{([^{}]*)\}/g)].map((m) => m[1].replace(/[\s$]/g, ''));
  if (boxed.length) return boxed[boxed.length - 1] === answer ? 1.0 : 0.1;
  const numbers = (reply || '').match(/-?\d+/g) || [];
  return numbers.length && numbers[numbers.length - 1] === answer ? 0.5 : 0.0;
}

class Agent {
  constructor(opts) {
    this.opts = opts;
    this.client = new OpenAI({ baseURL: `${opts.url}/v1`, apiKey: opts.token || 'EMPTY', maxRetries: 5 });
    this.version = 0;
  }

  // The trinity-specific calls: plain JSON over HTTP, with the same token.
  async post(route, body) {
    const headers = { 'Content-Type': 'application/json' };
    if (this.opts.token) headers.Authorization = `Bearer ${this.opts.token}`;
    const response = await fetch(`${this.opts.url}${route}`, { method: 'POST', headers, body: JSON.stringify(body) });
    const payload = await response.json();
    if (!response.ok) throw new Error(`${route}: HTTP ${response.status}: ${JSON.stringify(payload.error)}`);
    return payload;
  }

  // The version the proxy serves now (GET /v1/models names it).
  async servedVersion() {
    const headers = this.opts.token ? { Authorization: `Bearer ${this.opts.token}` } : {};
    const response = await fetch(`${this.opts.url}/v1/models`, { headers });
    if (!response.ok) throw new Error(`/v1/models: HTTP ${response.status}`);
    return (await response.json()).data[0].model_version || 0;
  }

  // Seconds spent waiting until the proxy serves at least `minimum` (see Pacing above).
  async waitForVersion(minimum) {
    const started = Date.now();
    if (this.opts.maxLag < 0 || minimum <= 0) return 0;
    while ((await this.servedVersion()) < minimum) await new Promise((done) => setTimeout(done, 1000));
    return (Date.now() - started) / 1000;
  }

  // One episode: the question, the model's answer, the follow-up, its final answer.
  async episode(row, sessionId, temperature) {
    const versions = [];
    const ask = async (messages) => {
      // one key per request, reused by the SDK's retries: a retry whose answer was lost (a timeout,
      // the proxy restarting) gets the recorded response instead of a second sample
      const headers = { 'X-Session-Id': sessionId, 'Idempotency-Key': `${sessionId}-${randomUUID()}` };
      const reply = await this.client.chat.completions.create(
        { model: 'policy', messages, temperature, max_tokens: this.opts.maxTokens },
        { headers },
      );
      versions.push(reply.model_version || 0); // every response names the version that generated it
      this.version = Math.max(this.version, reply.model_version || 0);
      return reply.choices[0].message.content || '';
    };
    const messages = [{ role: 'user', content: row.question }];
    const first = await ask(messages);
    const final = await ask([...messages, { role: 'assistant', content: first }, { role: 'user', content: FOLLOW_UP }]);
    return { first, final, versions, reward: score(final, row.answer) };
  }

  async trainStep(step, rows) {
    const waited = await this.waitForVersion(step - 1 - this.opts.maxLag);
    const runs = rows.flatMap((row) => Array.from({ length: this.opts.group }, (_, k) => ({ row, k })));
    const results = await Promise.all(
      runs.map(async ({ row, k }) => {
        const session = `train-s${this.opts.seed}-step${step}-q${row.id}-r${k}`;
        const { reward } = await this.episode(row, session, this.opts.temperature);
        await this.post('/feedback', { session_id: session, reward, task_id: `s${this.opts.seed}-step${step}-q${row.id}` });
        await this.post('/commit', { session_id: session });
        return reward;
      }),
    );
    const mean = results.reduce((a, b) => a + b, 0) / results.length;
    console.log(JSON.stringify({ event: 'agent_step', step, episodes: results.length, reward_mean: mean, model_version: this.version, waited_s: waited }));
  }

  async evaluate(step, rows) {
    const started = Date.now();
    const finals = await Promise.all(
      rows.map((row) => this.episode(row, `eval-s${this.opts.seed}-step${step}-q${row.id}`, 0.0)),
    );
    const strict = finals.filter((f) => f.reward === 1.0).length / rows.length;
    const record = {
      time: Date.now() / 1000, // when it ended; eval_s says how long it took
      explorer: 'node-agent',
      mode: 'serve',
      step,
      model_version: Math.min(...finals.flatMap((f) => f.versions)), // the oldest weights it measured
      eval_s: (Date.now() - started) / 1000,
      scores: { [`eval/heldout/strict/mean@1`]: strict, [`eval/heldout/reward/mean@1`]: finals.reduce((a, f) => a + f.reward, 0) / rows.length },
    };
    console.log(JSON.stringify({ event: 'agent_eval', ...record }));
    if (this.opts.out) {
      fs.mkdirSync(path.dirname(this.opts.out), { recursive: true });
      fs.appendFileSync(this.opts.out, JSON.stringify(record) + '\n');
    }
    return strict;
  }
}

async function main() {
  const opts = options(process.argv);
  const train = shuffled(readRows(path.join(opts.data, 'train.jsonl')), opts.seed);
  const heldout = readRows(path.join(opts.data, 'heldout.jsonl')).slice(0, opts.heldout);
  const agent = new Agent(opts);
  if (opts.evalStep >= 0) return agent.evaluate(opts.evalStep, heldout); // one evaluation, labelled so
  await agent.evaluate(0, heldout);
  for (let step = 1; step <= opts.steps; step++) {
    const start = ((step - 1) * opts.batch) % train.length;
    await agent.trainStep(step, train.slice(start, start + opts.batch));
    if (step % opts.evalEvery === 0 || step === opts.steps) await agent.evaluate(step, heldout);
  }
}

main().catch((err) => {
  console.error(err.stack || String(err));
  process.exit(1);
});
