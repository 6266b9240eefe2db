// kafkajs over TLS and SASL, driven by compat/test_secure_clients.py and compat/test_acl_clients.py.
//
// Usage: node kafkajs_secure.js <bootstrap> <command> '<json options>'
// options.security: { ssl: { ca, cert, key } (file paths) | undefined, sasl: { mechanism, username, password } | undefined }
// Prints one JSON line {"result": ...}; kafkajs' own log goes to stderr. Exit code 1 with the error on stderr on failure.
'use strict'

const fs = require('fs')
const { Kafka, logLevel } = require('kafkajs')

const [bootstrap, command, rawOptions] = process.argv.slice(2)
const opts = JSON.parse(rawOptions || '{}')
const security = opts.security || {}

const connection = {}
if (security.ssl) {
  connection.ssl = { ca: [fs.readFileSync(security.ssl.ca, 'utf-8')] }
  if (security.ssl.cert) {
    connection.ssl.cert = fs.readFileSync(security.ssl.cert, 'utf-8')
    connection.ssl.key = fs.readFileSync(security.ssl.key, 'utf-8')
  }
}
if (security.sasl) connection.sasl = security.sasl

const options = {
  clientId: 'mqk-compat-secure',
  brokers: [bootstrap],
  logLevel: logLevel.NOTHING,
  connectionTimeout: 3000,
  authenticationTimeout: 3000,
  retry: { initialRetryTime: 100, retries: opts.retries === undefined ? 5 : opts.retries },
  ...connection
}
const kafka = new Kafka(options)

// The Kafka error codes kafkajs logged: where it replaces a broker's answer with an error of its own (a failed
// FindCoordinator becomes "Failed to find group coordinator"), the answer is only in its debug log.
const loggedCodes = []
const logging = new Kafka({
  ...options,
  logLevel: logLevel.DEBUG,
  logCreator: () => ({ log }) => {
    if (log.error && typeof log.error.code === 'number') loggedCodes.push(log.error.code)
  }
})

const commands = {
  // Produce n values to partition 0, then read them back with a consumer of a fresh group.
  async roundtrip ({ topic, n }) {
    const producer = kafka.producer({ allowAutoTopicCreation: true })
    await producer.connect()
    const messages = []
    for (let i = 0; i < n; i++) messages.push({ value: `kafkajs-${i}`, partition: 0 })
    await producer.send({ topic, acks: -1, messages })
    await producer.disconnect()
    const consumer = kafka.consumer({ groupId: `secure-${Date.now()}`, sessionTimeout: 6000, heartbeatInterval: 1000, maxWaitTimeInMs: 200 })
    await consumer.connect()
    const got = []
    try {
      await consumer.subscribe({ topic, fromBeginning: true })
      await new Promise((resolve, reject) => {
        const timer = setTimeout(() => reject(new Error(`timeout: got ${got.length} of ${n}`)), 30000)
        consumer.run({
          eachMessage: async ({ message }) => {
            got.push(message.value.toString())
            if (got.length >= n) { clearTimeout(timer); resolve() }
          }
        })
      })
    } finally {
      await consumer.disconnect()
    }
    return { got }
  },

  // A user allowed to WRITE and READ `topic` and READ `group` (compat/test_acl_clients.py): what it can do, and the
  // Kafka error code of each refusal.
  async acl ({ topic, other, group, otherGroup, newTopic, n }) {
    // the Kafka error code of a refusal: kafkajs wraps the protocol error (cause, originalError, errors[])
    const code = err => {
      const seen = []
      for (let e = err; e && !seen.includes(e); e = e.cause || e.originalError || (e.errors && e.errors[0])) {
        if (typeof e.code === 'number') return e.code
        seen.push(e)
      }
      return String(err && err.message)
    }
    const out = {}
    const producer = kafka.producer({ allowAutoTopicCreation: false })
    await producer.connect()
    try {
      const messages = []
      for (let i = 0; i < n; i++) messages.push({ value: `v-${i}`, partition: 0 })
      await producer.send({ topic, acks: -1, messages })
      out.produced = n
      try {
        await producer.send({ topic: other, acks: -1, messages: [{ value: 'must not land', partition: 0 }] })
        out.denied_topic = 0
      } catch (err) {
        out.denied_topic = code(err)
      }
    } finally {
      await producer.disconnect()
    }
    const consume = async groupId => {
      loggedCodes.length = 0
      const consumer = logging.consumer({ groupId, sessionTimeout: 6000, heartbeatInterval: 1000, maxWaitTimeInMs: 200, retry: { retries: 0 } })
      const got = []
      try {
        await consumer.connect()
        await consumer.subscribe({ topic, fromBeginning: true })
        await new Promise((resolve, reject) => {
          const timer = setTimeout(() => reject(new Error(`timeout: got ${got.length} of ${n}`)), 30000)
          consumer.on(consumer.events.CRASH, event => { clearTimeout(timer); reject(event.payload.error) })
          consumer.run({
            autoCommit: true,
            eachMessage: async ({ message }) => {
              got.push(message.value.toString())
              if (got.length >= n) { clearTimeout(timer); resolve() }
            }
          }).catch(err => { clearTimeout(timer); reject(err) })
        })
        return { got, error: null }
      } catch (err) {
        const found = code(err)
        return { got, error: typeof found === 'number' ? found : (loggedCodes[0] || found) }
      } finally {
        await consumer.disconnect().catch(() => {})
      }
    }
    const mine = await consume(group)
    out.consumed = mine.got
    out.denied_group = (await consume(otherGroup)).error
    const admin = kafka.admin()
    await admin.connect()
    try {
      try {
        await admin.createTopics({ topics: [{ topic: newTopic, numPartitions: 1 }], waitForLeaders: false })
        out.create_topic = 0
      } catch (err) {
        out.create_topic = code(err)
      }
      out.listed = (await admin.listTopics()).sort()
    } finally {
      await admin.disconnect()
    }
    return out
  },

  // Try to produce; report how it was refused.
  async refused ({ topic }) {
    const producer = kafka.producer({ allowAutoTopicCreation: true })
    try {
      await producer.connect()
      await producer.send({ topic, acks: -1, messages: [{ value: 'must not land', partition: 0 }] })
    } catch (err) {
      return { refused: true, name: err.name, type: err.type || null, message: String(err.message) }
    } finally {
      await producer.disconnect().catch(() => {})
    }
    return { refused: false }
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
