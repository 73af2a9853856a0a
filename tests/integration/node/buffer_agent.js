// An external agent in Node.js: writes trajectories to the buffer and reads its stats, using only
// the .proto files (@grpc/proto-loader) and @grpc/grpc-js. Usage: node buffer_agent.js HOST:PORT BUFFER
// Prints one JSON line: {"create":..., "write":..., "retry":..., "stats":..., "bad":...}.
'use strict';
const path = require('path');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

const PROTOS = path.resolve(__dirname, '../../../protos');
const def = protoLoader.loadSync('trinity_grpc/buffer/v1/buffer.proto', {
  includeDirs: [PROTOS], keepCase: true, longs: Number, enums: String, defaults: true,
});
const { BufferService } = grpc.loadPackageDefinition(def).trinity_grpc.buffer.v1;

function call(client, method, request) {
  return new Promise((resolve, reject) => {
    const deadline = new Date(Date.now() + 10000);
    client[method](request, { deadline }, (err, res) => (err ? reject(err) : resolve(res)));
  });
}

function int32(values) {
  const buf = Buffer.alloc(4 * values.length);
  values.forEach((v, i) => buf.writeInt32LE(v, i * 4));
  return buf;
}

function float32(values) {
  const buf = Buffer.alloc(4 * values.length);
  values.forEach((v, i) => buf.writeFloatLE(v, i * 4));
  return buf;
}

function tokenTrajectory(prompt, response, logprobs, reward, version) {
  return {
    tokens: { dtype: 'ELEMENT_TYPE_INT32', raw: int32(prompt.concat(response)) },
    prompt_length: prompt.length,
    logprobs: { dtype: 'ELEMENT_TYPE_FLOAT32', raw: float32(logprobs) },
    action_mask: { dtype: 'ELEMENT_TYPE_BOOL', raw: Buffer.from(response.map(() => 1)) },
    reward, model_version: version, ids: { producer: 'node-agent', task_id: 'node-task' },
  };
}

function chatTrajectory(question, answer, reward, version) {
  // int_values instead of raw bytes also works for callers that cannot pack bytes; here: messages only.
  return {
    messages: [{ role: 'user', content: question }, { role: 'assistant', content: answer }],
    reward, model_version: version, ids: { producer: 'node-agent' },
  };
}

// protobufjs hands int64 map keys back as 8-char "long hashes" (little-endian bytes); decode them.
function int64Keys(map) {
  const out = {};
  for (const [key, value] of Object.entries(map)) {
    const plain = key.length === 8 ? Buffer.from(key, 'latin1').readBigInt64LE(0).toString() : key;
    out[plain] = value;
  }
  return out;
}

async function main() {
  const [address, buffer] = process.argv.slice(2);
  const client = new BufferService(address, grpc.credentials.createInsecure());
  const out = {};
  out.create = await call(client, 'CreateBuffer', { spec: { name: buffer, kind: 'BUFFER_KIND_FIFO' } });
  const request = {
    buffer, idempotency_key: 'node-agent-1',
    experiences: [
      tokenTrajectory([1, 2, 3], [4, 5], [-0.5, -0.25], 1.0, 4),
      tokenTrajectory([1, 2], [6, 7, 8], [-0.1, -0.2, -0.3], 0.0, 4),
      chatTrajectory('2+2?', '4', 1.0, 5),
    ],
  };
  out.write = await call(client, 'Write', request);
  out.retry = await call(client, 'Write', request);
  const bad = tokenTrajectory([1, 2, 3], [4, 5], [-0.5], 1.0, 4); // one logprob for two response tokens
  try {
    await call(client, 'Write', { buffer, experiences: [bad] });
    out.bad = { code: 0 };
  } catch (err) {
    out.bad = { code: err.code, details: err.details };
  }
  out.stats = await call(client, 'Stats', { buffer });
  out.stats.per_model_version = int64Keys(out.stats.per_model_version);
  const read = await call(client, 'Read', { buffer, batch_size: 10, max_wait_s: 0 });
  out.read = { count: read.experiences.length, rewards: read.experiences.map((e) => e.reward) };
  out.ack = await call(client, 'Ack', { lease_id: read.lease_id });
  client.close();
  console.log(JSON.stringify(out));
}

main().catch((err) => { console.error(err); process.exit(1); });
