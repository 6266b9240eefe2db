// ali-ons (a pure-JS RocketMQ 4.x remoting client) scenarios driven by compat/test_ali_ons.py and
// compat/test_cross_protocol.py.
//
//   node ons.js <namesrv host:port> produce '<json>'   sends messages, prints {"result": [send results]}
//   node ons.js <namesrv host:port> consume '<json>'   push consumer; prints one JSON event per line:
//        {"event":"assign","queues":[...]} whenever its queue set changes, {"event":"msg",...} per delivery;
//        SIGTERM closes the consumer (persists offsets, unregisters) and exits 0.
//   node ons.js <namesrv host:port> produce-loop '<json>'   sends `<prefix>-<n>` bodies one after another until
//        SIGTERM, printing {"event":"sent",...} or {"event":"error",...} per send (routes refreshed every second,
//        so it follows a broker group's new master)
// The client's own log goes to stderr so stdout carries only JSON.
'use strict'

const { Producer, Consumer, Message } = require('ali-ons')

const [nameSrv, command, rawOptions] = process.argv.slice(2)
const opts = JSON.parse(rawOptions || '{}')

const stderrLogger = {}
for (const level of ['debug', 'info', 'warn', 'error']) {
  stderrLogger[level] = (...args) => {
    if (level === 'debug' || level === 'info') return
    process.stderr.write(`[${level}] ${args.map(a => (a && a.stack) || String(a)).join(' ')}\n`)
  }
}

// ali-ons insists on an HTTP client and access keys; with nameSrv given it never uses the former. It signs every
// request with the latter: mqk ignores the signature unless its authorizer is on, and then checks it
// (compat/test_rocketmq_acl_clients.py passes `accessKey` / `secretKey` in the options).
const common = {
  nameSrv: nameSrv.split(';'), // several name servers separated by ';', as RocketMQ's namesrvAddr
  httpclient: { request: async () => { throw new Error('no HTTP in tests') } },
  accessKeyId: opts.accessKey || 'mqk-test-key',
  accessKeySecret: opts.secretKey || 'mqk-test-secret',
  logger: stderrLogger
}
const out = obj => process.stdout.write(JSON.stringify(obj) + '\n')

async function produce ({ group, messages }) {
  const producer = new Producer({ ...common, producerGroup: group || 'mqk-compat-producer', instanceName: `p${process.pid}` })
  await producer.ready()
  const results = []
  for (const m of messages) {
    const msg = new Message(m.topic, m.tags || '', Buffer.from(m.body))
    if (m.keys) msg.keys = m.keys
    for (const [k, v] of Object.entries(m.props || {})) msg.properties[k] = v
    if (m.deliverAfterMs) msg.setStartDeliverTime(Date.now() + m.deliverAfterMs)
    if (m.delayLevel) msg.delayTimeLevel = m.delayLevel
    const sentAt = Date.now()
    const r = await producer.send(msg)
    results.push({ sendStatus: r.sendStatus, msgId: r.msgId, brokerName: r.messageQueue.brokerName, queueId: Number(r.messageQueue.queueId), queueOffset: r.queueOffset, sentAt })
  }
  await producer.close()
  return results
}

async function produceLoop ({ topic, prefix, group }) {
  const producer = new Producer({
    ...common,
    producerGroup: group || 'mqk-compat-loop',
    instanceName: `l${process.pid}`,
    pollNameServerInterval: 1000,
    sendMsgTimeout: 10000
  })
  await producer.ready()
  let stopping = false
  const stop = () => { stopping = true }
  process.on('SIGTERM', stop)
  process.on('SIGINT', stop)
  for (let n = 0; !stopping; n++) {
    const body = `${prefix}-${n}`
    try {
      const r = await producer.send(new Message(topic, 'L', Buffer.from(body)))
      out({ event: 'sent', body, sendStatus: r.sendStatus, brokerName: r.messageQueue.brokerName, queueId: Number(r.messageQueue.queueId), queueOffset: r.queueOffset, at: Date.now() })
    } catch (err) {
      out({ event: 'error', body, message: String(err && err.message), at: Date.now() })
      await new Promise(resolve => setTimeout(resolve, 100))
    }
  }
  try { await producer.close() } catch (err) { process.stderr.write(`[close] ${err && err.message}\n`) }
  out({ event: 'closed' })
  process.exit(0)
}

async function consume ({ topic, group, subExpression = '*', failFirst = false, rebalanceMs = 1000 }) {
  const consumer = new Consumer({
    ...common,
    consumerGroup: group,
    consumeFromWhere: 'CONSUME_FROM_FIRST_OFFSET',
    rebalanceInterval: rebalanceMs,
    heartbeatBrokerInterval: 1000,
    persistConsumerOffsetInterval: 500,
    brokerSuspendMaxTimeMillis: 2000,
    consumerTimeoutMillisWhenSuspend: 5000,
    pullTimeDelayMillsWhenException: 500
  })
  consumer.on('error', err => process.stderr.write(`[consumer error] ${err && err.message}\n`))
  consumer.subscribe(topic, subExpression, async msg => {
    const event = {
      event: 'msg',
      topic: msg.topic,
      body: msg.body ? msg.body.toString() : null,
      tags: msg.tags || null,
      keys: msg.keys || null,
      props: msg.properties,
      queueId: msg.queueId,
      queueOffset: msg.queueOffset,
      msgId: msg.msgId,
      reconsumeTimes: msg.reconsumeTimes,
      bornTimestamp: msg.bornTimestamp,
      storeTimestamp: msg.storeTimestamp,
      receivedAt: Date.now()
    }
    if (failFirst && msg.reconsumeTimes === 0) {
      out({ ...event, event: 'fail' })
      throw new Error('failing the first delivery on purpose')
    }
    out(event)
  })
  await consumer.ready()
  out({ event: 'ready' })

  // Report the consumer's queue set whenever the rebalance changes it, so the test knows when the group has
  // settled before it sends.
  let last = ''
  const timer = setInterval(() => {
    const queues = Array.from(consumer.processQueueTable.keys()).filter(k => !k.includes('%RETRY%')).sort()
    const now = JSON.stringify(queues)
    if (now !== last) {
      last = now
      out({ event: 'assign', queues })
    }
  }, 100)

  let closing = false
  const shutdown = async () => {
    if (closing) return
    closing = true
    clearInterval(timer)
    try { await consumer.close() } catch (err) { process.stderr.write(`[close] ${err && err.message}\n`) }
    out({ event: 'closed' })
    process.exit(0)
  }
  process.on('SIGTERM', shutdown)
  process.on('SIGINT', shutdown)
}

async function main () {
  if (command === 'produce') {
    out({ result: await produce(opts) })
    process.exit(0)
  } else if (command === 'consume') {
    await consume(opts)
  } else if (command === 'produce-loop') {
    await produceLoop(opts)
  } else {
    throw new Error(`unknown command ${command}`)
  }
}

main().catch(err => {
  process.stderr.write(`FAILED: ${err && err.stack ? err.stack : err}\n`)
  process.exit(1)
})
