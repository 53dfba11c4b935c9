// The driver-matrix script for node-postgres (pg, pure JavaScript) through a shardgate router.
//
// Environment: SHARDGATE_URL, SHARDGATE_KEY_BASE, SHARDGATE_DRIVER (see ../python/psycopg_driver.py);
// SHARDGATE_MODE=isolation runs the isolation script instead (see isolation() below).
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

  step = 'scatter_merge'
  // Reads the router merges across shards: ORDER BY (k-way merge) with LIMIT/OFFSET,
  // aggregates, GROUP BY; named and unnamed statements alternately, like scatter_count. The
  // expectations come from this driver's keys (every one of them still in kv: no step deleted
  // a row, the updates changed only v), in BigInt. pg receives everything in text and hands
  // bigint and numeric over as strings.
  const big = keys.map(BigInt)
  const wantOrder = [...big].sort((a, b) => (a < b ? 1 : a > b ? -1 : 0)).slice(1, 4).map(String)
  const count = BigInt(big.length)
  const sum = big.reduce((a, b) => a + b, 0n)
  const min = big.reduce((a, b) => (b < a ? b : a))
  const max = big.reduce((a, b) => (b > a ? b : a))
  // avg = sum / count exactly, by long division: the integer part and 10 fraction digits,
  // and whether the quotient ends within them.
  const avgInt = String(sum / count)
  let rem = sum % count
  let avgFrac = ''
  for (let d = 0; d < 10; d++) {
    rem *= 10n
    avgFrac += String(rem / count)
    rem %= count
  }
  const avgExact = rem === 0n
  const wantGroups = [0n, 1n]
    .map((p) => [String(p), String(big.filter((k) => k % 2n === p).length)])
    .filter(([, n]) => n !== '0')
  const range = [keys[0], keys[ROWS - 1]]
  let sumGot, avgGot
  for (let i = 0; i < SCATTER_REPEAT; i++) {
    const named = (name, q) => (i % 2 === 0 ? { ...q, name } : q)
    let res = await client.query(named('drv_merge_order', { text: 'SELECT id FROM kv WHERE id BETWEEN $1 AND $2 ORDER BY id DESC LIMIT 3 OFFSET 1', values: range }))
    const ids = res.rows.map((r) => r.id)
    if (JSON.stringify(ids) !== JSON.stringify(wantOrder)) fail(`ORDER BY id DESC LIMIT 3 OFFSET 1: expected ${JSON.stringify(wantOrder)}, got ${JSON.stringify(ids)}`)
    res = await client.query(named('drv_merge_agg', { text: 'SELECT count(*) AS n, min(id) AS lo, max(id) AS hi, sum(id) AS s, avg(id) AS a FROM kv WHERE id BETWEEN $1 AND $2', values: range }))
    if (res.rows.length !== 1) fail(`aggregates: expected 1 row, got ${JSON.stringify(res.rows)}`)
    const r = res.rows[0]
    if (r.n !== String(count) || r.lo !== String(min) || r.hi !== String(max)) fail(`count, min, max: expected ${count}, ${min}, ${max}, got ${JSON.stringify(r)}`)
    if (typeof r.s !== 'string' || r.s !== String(sum)) fail(`sum(id): expected exactly ${sum}, got ${JSON.stringify(r.s)}`)
    const m = typeof r.a === 'string' ? /^(\d+)(?:\.(\d*))?$/.exec(r.a) : null
    if (!m) fail(`avg(id): expected a numeric string, got ${JSON.stringify(r.a)}`)
    const frac = m[2] || ''
    if (m[1] !== avgInt || frac.padEnd(10, '0').slice(0, 10) !== avgFrac || (avgExact && /[^0]/.test(frac.slice(10)))) {
      fail(`avg(id): expected ${sum}/${count} = ${avgInt}.${avgFrac}${avgExact ? '' : '…'}, got ${r.a}`)
    }
    sumGot = r.s
    avgGot = r.a
    res = await client.query(named('drv_merge_group', { text: 'SELECT id % 2 AS parity, count(*) AS n FROM kv WHERE id BETWEEN $1 AND $2 GROUP BY id % 2 ORDER BY parity', values: range }))
    const groups = res.rows.map((g) => [g.parity, g.n])
    if (JSON.stringify(groups) !== JSON.stringify(wantGroups)) fail(`GROUP BY id % 2: expected ${JSON.stringify(wantGroups)}, got ${JSON.stringify(groups)}`)
  }
  ok(`order/limit/offset, count/min/max/sum/avg (sum ${sumGot}, avg ${avgGot}), group by x${SCATTER_REPEAT}, named and unnamed, text numeric`)

  await client.end()
  console.log('PASS')
}

// The isolation script (SHARDGATE_MODE=isolation): while other shards are down or busy, this
// client's statements, all keyed to the healthy shard(s) of SHARDGATE_KEYS (rows with v = 'v<key>'),
// and the statements that need no shard at all, must never fail.
async function isolation() {
  const keys = process.env.SHARDGATE_KEYS.split(',').map(Number)
  step = 'connect'
  const client = new pg.Client({ connectionString: URL, ssl: false })
  await client.connect()
  ok()
  step = 'isolated'
  for (let round = 0; round < REPEAT; round++) {
    const one = await client.query('SELECT 1 AS one')
    if (one.rows[0].one !== 1) fail(`SELECT 1: ${JSON.stringify(one.rows)}`)
    for (const k of keys) {
      for (const q of [
        { text: 'SELECT v FROM kv WHERE id = $1', values: [k] },
        { name: 'iso_select', text: 'SELECT v FROM kv WHERE id = $1', values: [k] },
      ]) {
        const res = await client.query(q)
        if (res.rows.length !== 1 || res.rows[0].v !== `v${k}`) fail(`key ${k}: ${JSON.stringify(res.rows)}`)
      }
    }
  }
  ok(`${REPEAT} rounds of SELECT 1 and ${keys.length} keys, unnamed and named`)
  await client.end()
  console.log('PASS')
}

(process.env.SHARDGATE_MODE === 'isolation' ? isolation() : main()).catch((e) => {
  console.log(`FAIL ${step}: ${e instanceof Deviation ? '' : (e.code ? `SQLSTATE ${e.code}: ` : '') + e.constructor.name + ': '}${e.message}`)
  process.exit(1)
})
