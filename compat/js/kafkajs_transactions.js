// kafkajs transactions driven by compat/test_transactions_clients.py.
//
// Usage: node kafkajs_transactions.js <bootstrap> <command> '<json options>'
// Prints one JSON line {"result": ...} on success (the Python test asserts on it); kafkajs' own log goes to
// stderr so it never mixes with the result. Exit code 1 with the error on stderr on failure.
'use strict'

const { Kafka, logLevel } = require('kafkajs')

const [bootstrap, command, rawOptions] = process.argv.slice(2)
const opts = JSON.parse(rawOptions || '{}')

const stderrLog = () => ({ namespace, level, label, log }) => {
  process.stderr.write(`${label} ${namespace} ${log.message} ${JSON.stringify(log)}\n`)
}
const kafka = new Kafka({
  clientId: 'mqk-compat-txn',
  brokers: [bootstrap],
  logLevel: logLevel.WARN,
  logCreator: stderrLog,
  connectionTimeout: 3000,
  retry: { initialRetryTime: 100, retries: 8 }
})

async function withDeadline (ms, what, promise) {
  let timer
  const timeout = new Promise((resolve, reject) => { timer = setTimeout(() => reject(new Error(`timeout: ${what}`)), ms) })
  try { return await Promise.race([promise, timeout]) } finally { clearTimeout(timer) }
}

const commands = {
  // Runs `transactions` in order on one transactional producer: each is {commit: bool, messages: [{partition,
  // value}]}, sent in one send() (kafkajs waits for the produce answer, so an aborted transaction's records are on
  // the log before its EndTxn). Returns, per transaction, the base offsets the broker gave its records.
  async produce ({ topic, transactionalId, transactions }) {
    const producer = kafka.producer({ transactionalId, idempotent: true, maxInFlightRequests: 1 })
    await producer.connect()
    const sent = []
    try {
      for (const t of transactions) {
        const txn = await producer.transaction()
        const r = await txn.send({ topic, acks: -1, messages: t.messages.map(m => ({ value: m.value, partition: m.partition })) })
        if (t.commit) await txn.commit()
        else await txn.abort()
        sent.push(r.map(x => ({ partition: x.partition, baseOffset: Number(x.baseOffset), errorCode: x.errorCode })))
      }
    } finally {
      await producer.disconnect()
    }
    return { sent }
  },

  // Reads `topic` from the beginning with a throw-away group until the value `sentinel` has been seen on each of
  // `partitions`; readUncommitted false is read_committed. Returns every message read, sentinels included.
  async consume ({ topic, partitions, sentinel, readUncommitted, timeoutMs = 30000 }) {
    const consumer = kafka.consumer({
      groupId: `txn-read-${Date.now()}-${Math.random()}`,
      readUncommitted,
      sessionTimeout: 6000,
      heartbeatInterval: 1000,
      maxWaitTimeInMs: 200
    })
    const got = []
    const ended = new Set()
    await consumer.connect()
    try {
      await consumer.subscribe({ topic, fromBeginning: true })
      let done
      const finished = new Promise(resolve => { done = resolve })
      await consumer.run({
        autoCommit: false,
        eachMessage: async ({ partition, message }) => {
          const value = message.value && message.value.toString()
          got.push({ partition, offset: Number(message.offset), value })
          if (value === sentinel) ended.add(partition)
          if (ended.size >= partitions) done()
        }
      })
      await withDeadline(timeoutMs, `the sentinel on ${partitions} partitions (seen on ${[...ended]}, ${got.length} messages)`, finished)
    } finally {
      await consumer.disconnect()
    }
    return { got }
  }
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
