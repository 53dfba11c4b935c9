// The driver-matrix script for node-postgres (pg, pure JavaScript) through a shardgate router.
//
// Environment: SHARDGATE_URL, SHARDGATE_KEY_BASE, SHARDGATE_DRIVER (see ../python/psycopg_driver.py).
// Prints one line per step; exits 1 with "FAIL <step>: ..." on the first deviation.
'use strict'

const pg = require('pg')

const URL = process.env.SHARDGATE_URL
const BASE = Number(process.env.SHARDGATE_KEY_BASE)
const NAME = process.env.SHARDGATE_DRIVER || 'node'
const ROWS = 20
const REPEAT = 12
const SCATTER_REPEAT = 7

let step = 'start'

class Deviation extends Error {}

function fail(msg) {
  throw new Deviation(msg)
}

function ok(detail) {
  console.log(`ok ${step}${detail ? ': ' + detail : ''}`)
}

async function expectSqlstate(promise, want) {
  try {
    await promise
  } catch (e) {
    if (e instanceof Deviation) throw e
    if (e.code !== want) fail(`expected SQLSTATE ${want}, got ${e.code}: ${e.message}`)
    return e
  }
  fail(`expected SQLSTATE ${want}, the statement succeeded`)
}

async function main() {
  const config = { connectionString: URL, ssl: false }
  step = 'connect'
  const client = new pg.Client(config)
  await client.connect()
  const version = require('pg/package.json').version
  ok(`pg ${version}`)

  step = 'ddl_broadcast'
  // A query without values goes out in the simple query protocol.
  await client.query(`CREATE INDEX IF NOT EXISTS kv_drv_${NAME} ON kv (v)`)
  ok('simple protocol')

  step = 'insert'
  const keys = []
  for (let i = 1; i <= ROWS; i++) keys.push(BASE + i)
  for (const k of keys) {
    // Values → extended protocol with the unnamed statement.
    const r = await client.query('INSERT INTO kv (id, v) VALUES ($1, $2)', [k, `v${k}`])
    if (r.rowCount !== 1) fail(`insert ${k}: rowCount ${r.rowCount}`)
  }
  ok(`${ROWS} rows, unnamed statements`)

  step = 'point_select'
  for (let r = 0; r < REPEAT; r++) {
    for (const k of keys) {
      // name: → a named server-side prepared statement, parsed once per connection.
      const res = await client.query({ name: 'drv_point', text: 'SELECT v FROM kv WHERE id = $1', values: [k] })
      if (res.rows.length !== 1 || res.rows[0].v !== `v${k}`) fail(`key ${k}: got ${JSON.stringify(res.rows)}`)
    }
  }
  ok(`${REPEAT * ROWS} selects, named statement drv_point`)

  const select = (k) => client.query({ name: 'drv_point', text: 'SELECT v FROM kv WHERE id = $1', values: [k] }).then((r) => r.rows.map((x) => x.v))

  step = 'tx_commit'
  let k = keys[0]
  await client.query('BEGIN')
  let rows = (await client.query('SELECT v FROM kv WHERE id = $1 FOR UPDATE', [k])).rows
  if (rows.length !== 1 || rows[0].v !== `v${k}`) fail(`in tx: got ${JSON.stringify(rows)}`)
  await client.query('UPDATE kv SET v = $1 WHERE id = $2', ['updated', k])
  await client.query('COMMIT')
  let got = await select(k)
  if (got.length !== 1 || got[0] !== 'updated') fail(`after commit: got ${JSON.stringify(got)}`)
  ok()

  step = 'tx_rollback'
  k = keys[1]
  await client.query('BEGIN')
  await client.query('UPDATE kv SET v = $1 WHERE id = $2', ['rolled back', k])
  got = await select(k)
  if (got[0] !== 'rolled back') fail(`inside the tx: got ${JSON.stringify(got)}`)
  await client.query('ROLLBACK')
  got = await select(k)
  if (got.length !== 1 || got[0] !== `v${k}`) fail(`after rollback: got ${JSON.stringify(got)}`)
  ok()

  step = 'unique_violation'
  k = keys[2]
  await expectSqlstate(client.query('INSERT INTO kv (id, v) VALUES ($1, $2)', [k, 'dup']), '23505')
  got = await select(k)
  if (got.length !== 1 || got[0] !== `v${k}`) fail(`connection reused after the error: got ${JSON.stringify(got)}`)
  ok()

  step = 'cancel'
  // node-postgres's cancel API: Client#cancel(clientToCancel, query) opens a new connection
  // and sends a CancelRequest with the BackendKeyData the router handed out.
  const started = Date.now()
  const sleep = client.query('SELECT pg_sleep(10)')
  const query = client.activeQuery
  if (!query) fail('no active query to cancel')
  setTimeout(() => new pg.Client(config).cancel(client, query), 500)
  await expectSqlstate(sleep, '57014')
  const took = (Date.now() - started) / 1000
  if (took > 5) fail(`the cancel took ${took.toFixed(1)}s`)
  const one = (await client.query('SELECT 1 AS one')).rows[0].one
  if (one !== 1) fail('connection not usable after the cancel')
  ok(`57014 after ${took.toFixed(2)}s`)

  step = 'scatter_count'
  // A read of the sharded table without a key: scattered to every shard, counts summed. The
  // range count is exact whatever the other drivers insert meanwhile; run as a named
  // statement and as an unnamed one.
  for (let i = 0; i < SCATTER_REPEAT; i++) {
    const q = { text: 'SELECT count(*) AS n FROM kv WHERE id BETWEEN $1 AND $2', values: [keys[0], keys[ROWS - 1]] }
    if (i % 2 === 0) q.name = 'drv_count'
    const n = (await client.query(q)).rows[0].n
    if (n !== String(ROWS)) fail(`count of this driver's range: expected ${ROWS}, got ${n}`)
  }
  const total = Number((await client.query('SELECT count(*) AS n FROM kv')).rows[0].n)
  if (!(total >= ROWS)) fail(`SELECT count(*) FROM kv: ${total} < the ${ROWS} rows of this driver alone`)
  ok(`range count ${ROWS} x${SCATTER_REPEAT}, total ${total}`)

  await client.end()
  console.log('PASS')
}

main().catch((e) => {
  console.log(`FAIL ${step}: ${e instanceof Deviation ? '' : (e.code ? `SQLSTATE ${e.code}: ` : '') + e.constructor.name + ': '}${e.message}`)
  process.exit(1)
})
