// kafkajs scenarios driven by compat/test_kafkajs.py.
//
// Usage: node kafkajs_client.js <bootstrap> <command> '<json options>'
// Prints one JSON line {"result": ...} on success (the Python test asserts on it); kafkajs' own log goes to
// stderr so it never mixes with the result. Exit code 1 with the error on stderr on failure.
'use strict'

const { EventEmitter } = require('events')
const { Kafka, CompressionTypes, CompressionCodecs, logLevel } = require('kafkajs')
const SnappyCodec = require('kafkajs-snappy')
const lz4 = require('lz4js')
const { ZstdCodec } = require('zstd-codec')

// kafkajs ships gzip only; the other codecs are plug-ins. lz4js writes the LZ4 frame format Kafka uses;
// zstd-codec is zstd compiled to JS, so no native build is needed.
CompressionCodecs[CompressionTypes.Snappy] = SnappyCodec
CompressionCodecs[CompressionTypes.LZ4] = () => ({
  async compress (encoder) { return Buffer.from(lz4.compress(encoder.buffer)) },
  async decompress (buffer) { return Buffer.from(lz4.decompress(buffer)) }
})
const zstdReady = new Promise(resolve => ZstdCodec.run(z => resolve(z)))
CompressionCodecs[CompressionTypes.ZSTD] = () => ({
  async compress (encoder) { const z = await zstdReady; return Buffer.from(new z.Simple().compress(encoder.buffer, 3)) },
  async decompress (buffer) { const z = await zstdReady; return Buffer.from(new z.Streaming().decompress(buffer)) }
})
const CODECS = {
  none: CompressionTypes.None,
  gzip: CompressionTypes.GZIP,
  snappy: CompressionTypes.Snappy,
  lz4: CompressionTypes.LZ4,
  zstd: CompressionTypes.ZSTD
}

const [bootstrap, command, rawOptions] = process.argv.slice(2)
const opts = JSON.parse(rawOptions || '{}')

const stderrLog = () => ({ namespace, level, label, log }) => {
  process.stderr.write(`${label} ${namespace} ${log.message} ${JSON.stringify(log)}\n`)
}
// a client whose only bootstrap address is `address` (it learns the rest of the cluster from Metadata)
const kafkaAt = address => new Kafka({
  clientId: 'mqk-compat',
  brokers: [address],
  logLevel: logLevel.WARN,
  logCreator: stderrLog,
  connectionTimeout: 3000,
  retry: { initialRetryTime: 100, retries: 8 }
})
const kafka = kafkaAt(bootstrap)

const headersOf = h => Object.fromEntries(Object.entries(h || {}).map(([k, v]) => [k, v === null ? null : v.toString()]))

async function withDeadline (ms, what, promise) {
  let timer
  const timeout = new Promise((resolve, reject) => { timer = setTimeout(() => reject(new Error(`timeout: ${what}`)), ms) })
  try { return await Promise.race([promise, timeout]) } finally { clearTimeout(timer) }
}

// Read `count` messages of a topic from the beginning with a throw-away group (`options`: more consumer settings).
async function readAll (topic, count, timeoutMs = 20000, options = {}) {
  const consumer = kafka.consumer({ groupId: `read-${Date.now()}-${Math.random()}`, sessionTimeout: 6000, heartbeatInterval: 1000, maxWaitTimeInMs: 200, ...options })
  const out = []
  await consumer.connect()
  try {
    await consumer.subscribe({ topic, fromBeginning: true })
    let done
    const finished = new Promise(resolve => { done = resolve })
    await consumer.run({
      autoCommit: false,
      eachMessage: async ({ partition, message }) => {
        out.push({ partition, offset: Number(message.offset), key: message.key && message.key.toString(), value: message.value && message.value.toString(), headers: headersOf(message.headers), timestamp: Number(message.timestamp) })
        if (out.length >= count) done()
      }
    })
    await withDeadline(timeoutMs, `reading ${count} messages (got ${out.length})`, finished)
  } finally {
    await consumer.disconnect()
  }
  return out
}

const commands = {
  // Every message of a topic, read by a consumer that names its rack (KIP-392's rackId: it may read from a follower)
  // with read_uncommitted (kafkajs reads committed by default).
  async readInRack ({ topic, count, rackId }) {
    return { got: await readAll(topic, count, 30000, { rackId, readUncommitted: true }) }
  },

  // Keys, headers and one codec, produced by kafkajs and read back by kafkajs.
  async roundtrip ({ topic, codec, n }) {
    const producer = kafka.producer({ allowAutoTopicCreation: true })
    await producer.connect()
    const messages = []
    for (let i = 0; i < n; i++) {
      messages.push({ key: `js-${i}`, value: `kafkajs ${i} `.repeat(i + 1), partition: 0, headers: { idx: String(i), codec } })
    }
    const sent = await producer.send({ topic, compression: CODECS[codec], acks: -1, messages })
    await producer.disconnect()
    const got = await readAll(topic, n)
    return { sent: sent.map(r => ({ partition: r.partition, baseOffset: Number(r.baseOffset), errorCode: r.errorCode })), messages, got }
  },

  // Three members; c joins after a and b consumed part of the first batch, a leaves later. Then one last value
  // per partition: a partition is consumed in order, so once every last value is in, any value of it that was
  // going to be delivered (twice, too) has been. Every member commits the offset of each message right after
  // processing it.
  async group ({ topic, group, batch }) {
    const producer = kafka.producer()
    await producer.connect()
    const produce = async (start, count) => {
      const messages = []
      for (let v = start; v < start + count; v++) messages.push({ value: String(v), partition: v % 6 })
      await producer.send({ topic, acks: -1, messages })
    }
    const values = { a: [], b: [], c: [] }
    const assigned = { a: 0, b: 0, c: 0 }
    const members = {}
    const total = () => new Set([].concat(values.a, values.b, values.c)).size
    // every message consumed and every assignment emits 'change': a wait checks its condition then, never polls
    const changes = new EventEmitter()
    const waitFor = (pred, ms, what) => new Promise((resolve, reject) => {
      const check = () => { if (pred()) { stop(); resolve() } }
      const timer = setTimeout(() => {
        stop()
        reject(new Error(`timeout waiting for ${what}: ${JSON.stringify({ total: total(), assigned })}`))
      }, ms)
      const stop = () => { clearTimeout(timer); changes.off('change', check) }
      changes.on('change', check)
      check()
    })
    const start = async name => {
      const c = kafka.consumer({ groupId: group, sessionTimeout: 6000, rebalanceTimeout: 10000, heartbeatInterval: 1000, maxWaitTimeInMs: 200 })
      c.on(c.events.GROUP_JOIN, e => {
        const a = e.payload.memberAssignment || {}
        assigned[name] = Object.values(a).reduce((n, parts) => n + parts.length, 0)
        changes.emit('change')
      })
      await c.connect()
      await c.subscribe({ topic, fromBeginning: true })
      await c.run({
        autoCommit: false,
        // A message counts as processed once its offset is committed: if the commit fails in a rebalance,
        // kafkajs delivers it again (here or to the new owner) and it is counted then.
        eachMessage: async ({ topic, partition, message }) => {
          await c.commitOffsets([{ topic, partition, offset: String(Number(message.offset) + 1) }])
          values[name].push(Number(message.value.toString()))
          changes.emit('change')
        }
      })
      members[name] = c
    }
    await produce(0, batch)
    await start('a')
    await start('b')
    await waitFor(() => total() >= batch / 3, 30000, 'a and b consuming')
    await start('c')
    await waitFor(() => assigned.c > 0, 30000, 'c assigned')
    await produce(batch, batch)
    await waitFor(() => total() >= 2 * batch, 30000, 'second batch')
    await members.a.disconnect()
    await produce(2 * batch, batch)
    await waitFor(() => total() >= 3 * batch, 30000, 'third batch')
    await produce(3 * batch, 6)
    await waitFor(() => total() >= 3 * batch + 6, 30000, 'the last value of every partition')
    await members.b.disconnect()
    await members.c.disconnect()
    await producer.disconnect()
    return values
  },

  async admin ({ topic }) {
    const admin = kafka.admin()
    await admin.connect()
    const r = {}
    r.created = await admin.createTopics({ topics: [{ topic, numPartitions: 2, configEntries: [{ name: 'retention.ms', value: '7777777' }] }], waitForLeaders: true })
    r.createdAgain = await admin.createTopics({ topics: [{ topic, numPartitions: 2 }] })
    r.listed = (await admin.listTopics()).includes(topic)
    const md = await admin.fetchTopicMetadata({ topics: [topic] })
    r.partitions = md.topics[0].partitions.map(p => p.partitionId).sort()
    const describe = async () => {
      const res = await admin.describeConfigs({ includeSynonyms: false, resources: [{ type: 2, name: topic }] })
      return Object.fromEntries(res.resources[0].configEntries.map(e => [e.configName, { value: e.configValue, isDefault: e.isDefault, source: e.configSource }]))
    }
    r.configs = await describe()
    await admin.alterConfigs({ validateOnly: false, resources: [{ type: 2, name: topic, configEntries: [{ name: 'retention.ms', value: '1000000' }] }] })
    r.configsAfterAlter = await describe()
    await admin.createPartitions({ topicPartitions: [{ topic, count: 3 }] })
    r.partitionsAfter = (await admin.fetchTopicMetadata({ topics: [topic] })).topics[0].partitions.length

    // offsets by timestamp
    const producer = kafka.producer()
    await producer.connect()
    const base = Date.now() - 60000
    for (let i = 0; i < 6; i++) {
      await producer.send({ topic, messages: [{ value: String(i), partition: 0, timestamp: String(base + i * 1000) }] })
    }
    await producer.disconnect()
    r.byTimestamp = await admin.fetchTopicOffsetsByTimestamp(topic, base + 2500)
    r.offsets = await admin.fetchTopicOffsets(topic)

    await admin.deleteTopics({ topics: [topic] })
    r.listedAfterDelete = (await admin.listTopics()).includes(topic) // mqk answers once the topic is gone
    await admin.disconnect()
    return r
  },

  // Consume `count` messages in `group`, commit, leave. Run twice around a broker restart.
  async consumeCommit ({ topic, group, count }) {
    const consumer = kafka.consumer({ groupId: group, sessionTimeout: 6000, heartbeatInterval: 1000, maxWaitTimeInMs: 200 })
    const got = []
    await consumer.connect()
    await consumer.subscribe({ topic, fromBeginning: true })
    let done
    const finished = new Promise(resolve => { done = resolve })
    await consumer.run({
      autoCommit: false,
      eachMessage: async ({ topic, partition, message }) => {
        if (got.length >= count) return
        got.push(Number(message.offset))
        await consumer.commitOffsets([{ topic, partition, offset: String(Number(message.offset) + 1) }])
        if (got.length >= count) done()
      }
    })
    await withDeadline(25000, `consuming ${count}`, finished)
    await consumer.disconnect()
    return { offsets: got }
  },

  async produce ({ topic, n, start = 0 }) {
    const producer = kafka.producer()
    await producer.connect()
    const messages = []
    for (let i = start; i < start + n; i++) messages.push({ value: String(i), partition: 0 })
    const r = await producer.send({ topic, acks: -1, messages })
    await producer.disconnect()
    return r.map(x => ({ baseOffset: Number(x.baseOffset), errorCode: x.errorCode }))
  },

  // Idempotent producer kept open while the broker restarts: the test writes a line on stdin once the
  // broker is back.
  async idempotent ({ topic, n }) {
    const producer = kafka.producer({ idempotent: true, maxInFlightRequests: 1 })
    await producer.connect()
    const offsets = []
    for (let i = 0; i < n; i++) {
      const r = await producer.send({ topic, messages: [{ value: String(i), partition: 0 }] })
      offsets.push(Number(r[0].baseOffset))
    }
    process.stdout.write(JSON.stringify({ phase: 'restart-now' }) + '\n')
    await new Promise(resolve => process.stdin.once('data', resolve))
    for (let i = n; i < 2 * n; i++) {
      const r = await producer.send({ topic, messages: [{ value: String(i), partition: 0 }] })
      offsets.push(Number(r[0].baseOffset))
    }
    await producer.disconnect()
    const got = await readAll(topic, 2 * n)
    return { offsets, values: got.map(m => Number(m.value)) }
  }
}

// A cluster of brokers (compat/test_cluster_clients.py): every client below is bootstrapped on one broker only.
// The admin on the first creates a 12-partition topic; a producer on the second writes `n` values, value v to
// partition v % 12; members a, b, c of one group, each bootstrapped on its own broker, consume them once the
// group has settled (each holds a share of the partitions), committing each offset after processing it; then
// `more` values are written and a new member (on the last broker) resumes from the committed offsets. Then the
// admin calls, each from a client bootstrapped on a different broker.
commands.cluster = async ({ bootstraps, topic, group, n, more, adminTopic }) => {
  const clients = bootstraps.map(kafkaAt)
  const at = i => clients[i % clients.length]
  const r = {}
  const admin = at(0).admin()
  await admin.connect()
  r.created = await admin.createTopics({ topics: [{ topic, numPartitions: 12 }], waitForLeaders: true })
  r.leaders = (await admin.fetchTopicMetadata({ topics: [topic] })).topics[0].partitions
    .map(p => ({ partition: p.partitionId, leader: p.leader }))
  await admin.disconnect()

  const producer = at(1).producer()
  await producer.connect()
  const produce = async (start, count) => {
    const messages = []
    for (let v = start; v < start + count; v++) messages.push({ value: String(v), partition: v % 12 })
    return (await producer.send({ topic, acks: -1, messages })).map(x => ({ partition: x.partition, errorCode: x.errorCode }))
  }

  const values = { a: [], b: [], c: [] }
  const assigned = { a: 0, b: 0, c: 0 }
  const changes = new EventEmitter()
  const total = () => new Set([].concat(values.a, values.b, values.c)).size
  const waitFor = (pred, ms, what) => new Promise((resolve, reject) => {
    const check = () => { if (pred()) { stop(); resolve() } }
    const timer = setTimeout(() => {
      stop()
      reject(new Error(`timeout waiting for ${what}: ${JSON.stringify({ total: total(), assigned })}`))
    }, ms)
    const stop = () => { clearTimeout(timer); changes.off('change', check) }
    changes.on('change', check)
    check()
  })
  const member = async (name, client, sink) => {
    const c = client.consumer({ groupId: group, sessionTimeout: 6000, rebalanceTimeout: 10000, heartbeatInterval: 1000, maxWaitTimeInMs: 200 })
    c.on(c.events.GROUP_JOIN, e => {
      const a = e.payload.memberAssignment || {}
      if (name in assigned) assigned[name] = Object.values(a).reduce((k, parts) => k + parts.length, 0)
      changes.emit('change')
    })
    await c.connect()
    await c.subscribe({ topic, fromBeginning: true })
    await c.run({
      autoCommit: false,
      eachMessage: async ({ topic, partition, message }) => {
        await c.commitOffsets([{ topic, partition, offset: String(Number(message.offset) + 1) }])
        sink.push(Number(message.value.toString()))
        changes.emit('change')
      }
    })
    return c
  }
  const members = []
  for (const [i, name] of ['a', 'b', 'c'].entries()) members.push(await member(name, at(i), values[name]))
  // c is in the group only from the last generation on: once it holds partitions and the three shares cover
  // the topic, every member has the last assignment and no rebalance is left to redeliver anything
  await waitFor(() => assigned.a > 0 && assigned.b > 0 && assigned.c > 0 && assigned.a + assigned.b + assigned.c === 12, 60000, 'the group to settle')
  r.assigned = { ...assigned }
  r.sent = await produce(0, n)
  await waitFor(() => total() >= n, 60000, `${n} values consumed`)
  for (const c of members) await c.disconnect()
  r.values = values

  r.sentMore = await produce(n, more)
  await producer.disconnect()
  const resumed = []
  const next = await member('resumer', at(2), resumed)
  await waitFor(() => resumed.length >= more, 60000, `the resumed member to read ${more} values`)
  await next.disconnect()
  r.resumed = resumed

  // admin calls, each client bootstrapped on another broker
  const admins = clients.map(k => k.admin())
  for (const a of admins) await a.connect()
  r.described = await Promise.all(admins.map(async a => {
    const d = await a.describeCluster()
    return { brokers: d.brokers.map(b => b.nodeId).sort(), controller: d.controller, clusterId: d.clusterId }
  }))
  r.createdAdminTopic = await admins[1].createTopics({ topics: [{ topic: adminTopic, numPartitions: 2, configEntries: [{ name: 'retention.ms', value: '7777777' }] }], waitForLeaders: true })
  // a client may ask a broker whose view is a moment behind the one that made a change: asked again until the
  // answer is the one expected (or the deadline passes, and the test sees the last answer)
  const askUntil = async (ask, expected, ms = 15000) => {
    const deadline = Date.now() + ms
    for (;;) {
      let answer
      try { answer = await ask() } catch (e) { answer = `error: ${e.message}` }
      if (answer === expected || Date.now() > deadline) return answer
      await new Promise(resolve => setTimeout(resolve, 50)) // (the one poll here: nothing to wait on but the answer)
    }
  }
  r.listed = await Promise.all(admins.map(a => askUntil(async () => (await a.listTopics()).includes(adminTopic), true)))
  const retention = async a => {
    const res = await a.describeConfigs({ includeSynonyms: false, resources: [{ type: 2, name: adminTopic }] })
    return Object.fromEntries(res.resources[0].configEntries.map(e => [e.configName, e.configValue]))['retention.ms']
  }
  r.retention = await askUntil(() => retention(admins[2]), '7777777')
  await admins[0].alterConfigs({ validateOnly: false, resources: [{ type: 2, name: adminTopic, configEntries: [{ name: 'retention.ms', value: '1000000' }] }] })
  r.retentionAfterAlter = await askUntil(() => retention(admins[1]), '1000000')
  await admins[2].createPartitions({ topicPartitions: [{ topic: adminTopic, count: 5 }] })
  r.partitionsAfter = await askUntil(async () => (await admins[0].fetchTopicMetadata({ topics: [adminTopic] })).topics[0].partitions.length, 5)
  await admins[1].deleteTopics({ topics: [adminTopic] })
  r.listedAfterDelete = await askUntil(async () => (await admins[1].listTopics()).includes(adminTopic), false)
  for (const a of admins) await a.disconnect()
  return r
}

// A partition moved to another broker group (AlterPartitionReassignments): `n` values written, the move asked for
// (to the first of `nodes` that is not the partition's leader) and listed until it is no longer in progress, `more`
// values written, all read back. A move to a node the cluster does not have is refused: its error type.
commands.reassign = async ({ topic, nodes, n, more }) => {
  const admin = kafka.admin()
  await admin.connect()
  const r = {}
  await admin.createTopics({ topics: [{ topic, numPartitions: 1 }], waitForLeaders: true })
  const leaderOf = async () => (await admin.fetchTopicMetadata({ topics: [topic] })).topics[0].partitions[0].leader
  r.before = await leaderOf()
  const producer = kafka.producer()
  await producer.connect()
  const send = async (start, count) => {
    const messages = []
    for (let i = start; i < start + count; i++) messages.push({ value: String(i), partition: 0 })
    return producer.send({ topic, acks: -1, messages })
  }
  await send(0, n)
  const to = nodes.find(node => node !== r.before)
  r.to = to
  try {
    await admin.alterPartitionReassignments({ topics: [{ topic, partitionAssignment: [{ partition: 0, replicas: [to] }] }] })
  } catch (e) {
    r.refused = e.errors ? e.errors.map(x => x.type).join(",") : (e.type || e.message) // (a per-partition error comes aggregated)
  }
  // until the move has ended and, for a move made, Metadata names its new leader: the controller answers the
  // listing once it has recorded the switch, and the broker kafkajs asks for Metadata (any of them) learns it by
  // its own etcd watch, which may come a moment later (or the deadline passes, and the test sees the last answer)
  const deadline = Date.now() + 30000
  for (;;) {
    const listed = await admin.listPartitionReassignments({ topics: [{ topic, partitions: [0] }] })
    r.listed = (r.listed || 0) + 1
    const ended = listed.topics.every(t => t.partitions.length === 0)
    if (ended) r.after = await leaderOf()
    if ((ended && (r.refused || r.after === to)) || Date.now() > deadline) break
    await new Promise(resolve => setTimeout(resolve, 50)) // (nothing to wait on but the answer)
  }
  if (r.after === undefined) r.after = await leaderOf()
  await send(n, more)
  await producer.disconnect()
  await admin.disconnect()
  r.read = (await readAll(topic, n + more, 30000)).map(m => [m.offset, m.value])
  return r
}

async function main () {
  if (!commands[command]) throw new Error(`unknown command ${command}`)
  const result = await commands[command](opts)
  process.stdout.write(JSON.stringify({ result }) + '\n')
}

main().then(() => process.exit(0), err => {
  process.stderr.write(`FAILED: ${err && err.stack ? err.stack : err}\n`)
  process.exit(1)
})
