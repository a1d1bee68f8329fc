// Drives the official RocketMQ Node.js client (rocketmq-client-nodejs, pinned in package.json)
// against txhub's gRPC door, for tests/grpc/test_node_client.py. One command per run:
//
//   node scenario.js produce   normal + delayed sends, a committed transaction, and one left
//                              open for check-back, answered COMMIT by the transactionChecker
//   node scenario.js simple    SimpleConsumer: receive EXPECT messages, ack each
//   node scenario.js push      PushConsumer: bodies starting "poison" fail, others succeed
//                              (FIFO or not, as the server's settings say)
//   node scenario.js fifo_produce  sends to the message groups TXHUB_GROUPS, interleaved,
//                              TXHUB_PER_GROUP each; tries a transaction with a group
//   node scenario.js fifo_simple   SimpleConsumer in a FIFO group: acks all but the first
//                              receipt of TXHUB_STUCK (left to expire), until EXPECT acks
//   node scenario.js recall    a delayed send, recalled with its receipt's recall handle, twice
//
// Settings come from the environment (TXHUB_ENDPOINT, TXHUB_ACCESS_KEY, TXHUB_SECRET_KEY,
// TXHUB_TOPIC, TXHUB_GROUP, ...). The last stdout line is the result as JSON; the client's own
// log goes to stderr. Any failure exits non-zero.
'use strict';

const {
  ConsumeResult, Producer, PushConsumer, SimpleConsumer,
} = require('rocketmq-client-nodejs');
const { TransactionResolution } = require(
  'rocketmq-client-nodejs/proto/apache/rocketmq/v2/definition_pb',
);

const env = (name, fallback) => {
  const value = process.env[name] ?? fallback;
  if (value === undefined) throw new Error(`${name} is not set`);
  return value;
};
const sleep = ms => new Promise(resolve => setTimeout(resolve, ms));
const deadline = Date.now() + Number(env('TXHUB_SCENARIO_TIMEOUT_MS', '60000'));

// The client's logger otherwise writes to ~/logs/rocketmq/: stderr keeps it with the test.
const logger = {
  info: (...args) => console.error('INFO', Date.now() % 100000, ...args),
  warn: (...args) => console.error('WARN', ...args),
  error: (...args) => console.error('ERROR', ...args),
  debug: process.env.TXHUB_NODE_DEBUG ? (...args) => console.error('DEBUG', ...args) : () => {},
};
const common = () => ({
  endpoints: env('TXHUB_ENDPOINT'),
  namespace: '',
  sessionCredentials: {
    accessKey: env('TXHUB_ACCESS_KEY'), accessSecret: env('TXHUB_SECRET_KEY'),
  },
  requestTimeout: 10000,
  logger,
});

// A consumer of TXHUB_GROUP subscribed to every tag of TXHUB_TOPIC.
const consumerOptions = () => ({
  ...common(),
  consumerGroup: env('TXHUB_GROUP'),
  subscriptions: new Map([[ env('TXHUB_TOPIC'), '*' ]]),
});

async function produce() {
  const topic = env('TXHUB_TOPIC');
  const checked = [];
  const producer = new Producer({
    ...common(),
    topic,
    checker: {
      // Check-back over the Telemetry stream: the server asks about the open transaction.
      async check(messageView) {
        checked.push(messageView.messageId);
        return messageView.body.toString().includes('rollback')
          ? TransactionResolution.ROLLBACK : TransactionResolution.COMMIT;
      },
    },
  });
  await producer.startup();
  const result = {};
  try {
    const normal = await producer.send({
      topic, tag: 'TagN', keys: [ 'node-key' ], body: Buffer.from('node normal'),
      properties: new Map([[ 'from', 'node' ]]),
    });
    result.normal = normal.messageId;
    const delayed = await producer.send({
      topic, tag: 'TagN', body: Buffer.from('node delayed'),
      deliveryTimestamp: new Date(Date.now() + 2000),
    });
    result.delayed = delayed.messageId;
    result.delayed_due_ms = Date.now() + 2000;
    const committed = producer.beginTransaction();
    result.committed = (await producer.send(
      { topic, tag: 'TagN', body: Buffer.from('node committed') }, committed)).messageId;
    await committed.commit();
    // Sent and never resolved by this code: only check-back can settle it.
    const open = producer.beginTransaction();
    result.checked = (await producer.send(
      { topic, tag: 'TagN', body: Buffer.from('node settled by check-back') }, open)).messageId;
    while (!checked.includes(result.checked)) {
      if (Date.now() > deadline) throw new Error('check-back never reached the checker');
      await sleep(100);
    }
    // Let the checker's EndTransaction(SOURCE_SERVER_CHECK) reach the server before leaving.
    await sleep(1000);
    result.checker_saw = checked;
  } finally {
    await producer.shutdown();
  }
  return result;
}

async function simple() {
  const expect = Number(env('TXHUB_EXPECT'));
  const consumer = new SimpleConsumer({ ...consumerOptions(), awaitDuration: 5000 });
  await consumer.startup();
  const received = [];
  try {
    while (received.length < expect) {
      if (Date.now() > deadline) throw new Error(`received ${received.length} of ${expect}`);
      for (const message of await consumer.receive(16, 30000)) {
        received.push({
          id: message.messageId, body: message.body.toString(), tag: message.tag,
          keys: message.keys, properties: Object.fromEntries(message.properties),
          attempt: message.deliveryAttempt,
        });
        await consumer.ack(message);
      }
    }
  } finally {
    await consumer.shutdown();
  }
  return { received };
}

async function push() {
  const expectGood = Number(env('TXHUB_EXPECT'));
  const poisonDeliveries = Number(env('TXHUB_POISON_DELIVERIES'));
  const seen = {};
  const calls = [];
  let good = 0;
  let poison = 0;
  const consumer = new PushConsumer({
    ...consumerOptions(),
    messageListener: {
      async consume(messageView) {
        const body = messageView.body.toString();
        (seen[messageView.messageId] ??= []).push(messageView.deliveryAttempt);
        calls.push({ group: messageView.messageGroup, body, attempt: messageView.deliveryAttempt });
        await sleep(50); // a FIFO group's next message, were it handed out, would overlap
        if (body.startsWith('poison')) {
          poison += 1;
          return ConsumeResult.FAILURE;
        }
        good += 1;
        return ConsumeResult.SUCCESS;
      },
    },
  });
  await consumer.startup();
  let service;
  try {
    while (good < expectGood || poison < poisonDeliveries) {
      if (Date.now() > deadline) throw new Error(`push: good ${good}, poison ${poison}`);
      await sleep(100);
    }
    service = consumer.getConsumeService().constructor.name;
    // Let the last ack / nack / forward reach the server before the consumer leaves.
    await sleep(1000);
  } finally {
    await consumer.shutdown();
  }
  return { seen, calls, consume_service: service };
}

async function recall() {
  const topic = env('TXHUB_TOPIC');
  const producer = new Producer({ ...common(), topic });
  await producer.startup();
  try {
    const sent = await producer.send({
      topic, tag: 'TagN', body: Buffer.from('node recalled'),
      deliveryTimestamp: new Date(Date.now() + 60000),
    });
    const first = await producer.recallMessage(topic, sent.recallHandle);
    const again = await producer.recallMessage(topic, sent.recallHandle);
    return {
      sent: sent.messageId, handle: sent.recallHandle,
      recalled: first.messageId, again: again.messageId,
    };
  } finally {
    await producer.shutdown();
  }
}

async function fifoProduce() {
  const topic = env('TXHUB_TOPIC');
  const groups = env('TXHUB_GROUPS').split(',');
  const perGroup = Number(env('TXHUB_PER_GROUP'));
  const producer = new Producer({
    ...common(), topic, checker: { async check() { return TransactionResolution.COMMIT; } },
  });
  await producer.startup();
  const sent = Object.fromEntries(groups.map(group => [ group, [] ]));
  let txWithGroup = null;
  try {
    for (let i = 0; i < perGroup; i++) {
      for (const group of groups) {
        const receipt = await producer.send({
          topic, messageGroup: group, body: Buffer.from(`${group}:${i}`),
        });
        sent[group].push(receipt.messageId);
      }
    }
    // 1.0.8 refuses a transactional message with a group before sending it.
    try {
      await producer.send(
        { topic, messageGroup: groups[0], body: Buffer.from('tx') }, producer.beginTransaction());
    } catch (error) {
      txWithGroup = String(error.message);
    }
  } finally {
    await producer.shutdown();
  }
  return { sent, tx_with_group: txWithGroup };
}

async function fifoSimple() {
  const expect = Number(env('TXHUB_EXPECT'));
  const stuck = env('TXHUB_STUCK');
  const consumer = new SimpleConsumer({ ...consumerOptions(), awaitDuration: 5000 });
  await consumer.startup();
  const batches = [];
  let acked = 0;
  let leftToExpire = false;
  try {
    while (acked < expect) {
      if (Date.now() > deadline) throw new Error(`acked ${acked} of ${expect}`);
      const batch = [];
      for (const message of await consumer.receive(32, 10000)) {
        batch.push({
          id: message.messageId, group: message.messageGroup, attempt: message.deliveryAttempt,
          at: Date.now(),
        });
        if (message.messageGroup === stuck && !leftToExpire) {
          leftToExpire = true;
          continue;
        }
        await consumer.ack(message);
        acked += 1;
      }
      if (batch.length) batches.push(batch);
    }
  } finally {
    await consumer.shutdown();
  }
  return { batches };
}

const commands = {
  produce, simple, push, recall, fifo_produce: fifoProduce, fifo_simple: fifoSimple,
};

(async () => {
  const command = commands[process.argv[2]];
  if (!command) throw new Error(`usage: node scenario.js ${Object.keys(commands).join('|')}`);
  const result = await command();
  console.log(JSON.stringify(result));
  process.exit(0);
})().catch(error => {
  console.error('FAILED', error);
  process.exit(1);
});
