// The driver-matrix script for pgjdbc (Debian's libpostgresql-jdbc-java) through a shardgate
// router.
//
// Environment: SHARDGATE_URL (postgres://user:pass@host:port/db), SHARDGATE_KEY_BASE,
// SHARDGATE_DRIVER (see ../python/psycopg_driver.py); SHARDGATE_MODE=isolation runs
// isolation() instead, with SHARDGATE_KEYS.
// Prints one line per step; exits 1 with "FAIL <step>: ..." on the first deviation.

import java.math.BigDecimal;
import java.math.BigInteger;
import java.net.URI;
import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.sql.Statement;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.Properties;
import java.util.concurrent.Executors;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.TimeUnit;

import org.postgresql.PGStatement;

public class DriverMatrix {
    static final int ROWS = 20;
    static final int REPEAT = 12;
    static final int SCATTER_REPEAT = 7;
    static String step = "start";

    static class Deviation extends RuntimeException {
        Deviation(String msg) { super(msg); }
    }

    static void fail(String msg) { throw new Deviation(msg); }

    static void ok(String detail) {
        System.out.println("ok " + step + (detail.isEmpty() ? "" : ": " + detail));
        System.out.flush();
    }

    interface Sql { void run() throws SQLException; }

    static SQLException expectSqlstate(Sql body, String want) {
        try {
            body.run();
        } catch (SQLException e) {
            if (!want.equals(e.getSQLState())) {
                fail("expected SQLSTATE " + want + ", got " + e.getSQLState() + ": " + e.getMessage());
            }
            return e;
        }
        fail("expected SQLSTATE " + want + ", the statement succeeded");
        return null;
    }

    static String value(PreparedStatement select, long k) throws SQLException {
        select.setLong(1, k);
        try (ResultSet rs = select.executeQuery()) {
            if (!rs.next()) return null;
            String v = rs.getString(1);
            if (rs.next()) fail("key " + k + ": more than one row");
            return v;
        }
    }

    static void expectValue(PreparedStatement select, long k, String want, String what) throws SQLException {
        String got = value(select, k);
        if (!want.equals(got)) fail(what + ": key " + k + ": expected " + want + ", got " + got);
    }

    /** A connection to SHARDGATE_URL. */
    static Connection connect() throws Exception {
        URI url = new URI(System.getenv("SHARDGATE_URL"));
        String[] userInfo = url.getUserInfo().split(":", 2);
        Properties props = new Properties();
        props.setProperty("user", userInfo[0]);
        props.setProperty("password", userInfo[1]);
        props.setProperty("sslmode", "disable");
        // The default, written out: the 5th execution of a PreparedStatement switches it to a
        // named server-side statement (S_n).
        props.setProperty("prepareThreshold", "5");
        String jdbcUrl = "jdbc:postgresql://" + url.getHost() + ":" + url.getPort() + url.getPath();
        return DriverManager.getConnection(jdbcUrl, props);
    }

    static void run() throws Exception {
        long base = Long.parseLong(System.getenv("SHARDGATE_KEY_BASE"));
        String name = System.getenv().getOrDefault("SHARDGATE_DRIVER", "jdbc");
        step = "connect";
        Connection conn = connect();
        ok("pgjdbc " + conn.getMetaData().getDriverVersion());

        step = "ddl_broadcast";
        try (Statement st = conn.createStatement()) {
            st.execute("CREATE INDEX IF NOT EXISTS kv_drv_" + name + " ON kv (v)");
        }
        ok("extended protocol, unnamed statement");

        step = "insert";
        List<Long> keys = new ArrayList<>();
        for (int i = 1; i <= ROWS; i++) keys.add(base + i);
        try (PreparedStatement ins = conn.prepareStatement("INSERT INTO kv (id, v) VALUES (?, ?)")) {
            for (long k : keys) {
                ins.setLong(1, k);
                ins.setString(2, "v" + k);
                int n = ins.executeUpdate();
                if (n != 1) fail("insert " + k + ": " + n + " rows");
            }
        }
        ok(ROWS + " rows");

        step = "point_select";
        PreparedStatement select = conn.prepareStatement("SELECT v FROM kv WHERE id = ?");
        for (int r = 0; r < REPEAT; r++) {
            for (long k : keys) expectValue(select, k, "v" + k, "select");
        }
        if (!select.unwrap(PGStatement.class).isUseServerPrepare()) {
            fail("pgjdbc did not switch to a named server-side prepared statement");
        }
        ok(REPEAT * ROWS + " selects, named server-side statement after 5 uses");

        step = "tx_commit";
        long k = keys.get(0);
        conn.setAutoCommit(false);
        try (PreparedStatement lock = conn.prepareStatement("SELECT v FROM kv WHERE id = ? FOR UPDATE");
             PreparedStatement upd = conn.prepareStatement("UPDATE kv SET v = ? WHERE id = ?")) {
            expectValue(lock, k, "v" + k, "in tx");
            upd.setString(1, "updated");
            upd.setLong(2, k);
            if (upd.executeUpdate() != 1) fail("update: not 1 row");
        }
        conn.commit();
        conn.setAutoCommit(true);
        expectValue(select, k, "updated", "after commit");
        ok("");

        step = "tx_rollback";
        k = keys.get(1);
        conn.setAutoCommit(false);
        try (PreparedStatement upd = conn.prepareStatement("UPDATE kv SET v = ? WHERE id = ?")) {
            upd.setString(1, "rolled back");
            upd.setLong(2, k);
            if (upd.executeUpdate() != 1) fail("update: not 1 row");
        }
        expectValue(select, k, "rolled back", "inside the tx");
        conn.rollback();
        conn.setAutoCommit(true);
        expectValue(select, k, "v" + k, "after rollback");
        ok("");

        step = "unique_violation";
        final long dup = keys.get(2);
        try (PreparedStatement ins = conn.prepareStatement("INSERT INTO kv (id, v) VALUES (?, ?)")) {
            expectSqlstate(() -> {
                ins.setLong(1, dup);
                ins.setString(2, "dup");
                ins.executeUpdate();
            }, "23505");
        }
        expectValue(select, dup, "v" + dup, "connection reused after the error");
        ok("");

        step = "cancel";
        ScheduledExecutorService timer = Executors.newSingleThreadScheduledExecutor();
        try (Statement st = conn.createStatement()) {
            timer.schedule(() -> {
                try {
                    st.cancel();
                } catch (SQLException e) {
                    System.out.println("cancel() failed: " + e);
                }
            }, 500, TimeUnit.MILLISECONDS);
            long started = System.nanoTime();
            expectSqlstate(() -> st.executeQuery("SELECT pg_sleep(10)").close(), "57014");
            double took = (System.nanoTime() - started) / 1e9;
            if (took > 5) fail(String.format("the cancel took %.1fs", took));
            try (ResultSet rs = st.executeQuery("SELECT 1")) {
                if (!rs.next() || rs.getInt(1) != 1) fail("connection not usable after the cancel");
            }
            ok(String.format("57014 after %.2fs", took));
        } finally {
            timer.shutdownNow();
        }

        step = "scatter_count";
        // A read of the sharded table without a key: scattered to every shard, counts summed.
        // The range count is exact whatever the other drivers insert meanwhile; repeated past
        // prepareThreshold so that it also runs as a named server-side statement.
        try (PreparedStatement count = conn.prepareStatement("SELECT count(*) FROM kv WHERE id BETWEEN ? AND ?")) {
            for (int i = 0; i < SCATTER_REPEAT; i++) {
                count.setLong(1, keys.get(0));
                count.setLong(2, keys.get(ROWS - 1));
                try (ResultSet rs = count.executeQuery()) {
                    long n = rs.next() ? rs.getLong(1) : -1;
                    if (n != ROWS) fail("count of this driver's range: expected " + ROWS + ", got " + n);
                }
            }
        }
        long total;
        try (Statement st = conn.createStatement(); ResultSet rs = st.executeQuery("SELECT count(*) FROM kv")) {
            total = rs.next() ? rs.getLong(1) : -1;
        }
        if (total < ROWS) fail("SELECT count(*) FROM kv: " + total + " < the " + ROWS + " rows of this driver alone");
        ok("range count " + ROWS + " x" + SCATTER_REPEAT + ", total " + total);

        step = "scatter_merge";
        // Reads the router merges across shards: ORDER BY (k-way merge) with LIMIT/OFFSET,
        // aggregates, GROUP BY; repeated past prepareThreshold like scatter_count. The
        // expectations come from this driver's keys (every one of them still in kv: no step
        // deleted a row, the updates changed only v); numeric (sum and avg of bigint) is read
        // with getBigDecimal and compared exactly.
        List<Long> desc = new ArrayList<>(keys);
        Collections.sort(desc, Collections.reverseOrder());
        List<Long> wantOrder = desc.subList(1, 4);
        long lo = keys.get(0), hi = keys.get(ROWS - 1);
        long wantMin = Collections.min(keys), wantMax = Collections.max(keys);
        BigInteger wantSumInt = BigInteger.ZERO;
        long[] wantParity = new long[2];
        for (long key : keys) {
            wantSumInt = wantSumInt.add(BigInteger.valueOf(key));
            wantParity[(int) (key % 2)]++;
        }
        BigDecimal wantSum = new BigDecimal(wantSumInt);
        // Exact (the keys' average ends after one decimal); divide() without a MathContext
        // throws if the quotient does not terminate.
        BigDecimal wantAvg = wantSum.divide(BigDecimal.valueOf(keys.size()));
        List<String> wantGroups = new ArrayList<>();
        for (int p = 0; p < 2; p++) if (wantParity[p] > 0) wantGroups.add(p + ":" + wantParity[p]);
        BigDecimal sumGot = null, avgGot = null;
        boolean named;
        try (PreparedStatement order = conn.prepareStatement(
                 "SELECT id FROM kv WHERE id BETWEEN ? AND ? ORDER BY id DESC LIMIT 3 OFFSET 1");
             PreparedStatement agg = conn.prepareStatement(
                 "SELECT count(*), min(id), max(id), sum(id), avg(id) FROM kv WHERE id BETWEEN ? AND ?");
             PreparedStatement group = conn.prepareStatement(
                 "SELECT id % 2 AS parity, count(*) FROM kv WHERE id BETWEEN ? AND ? GROUP BY id % 2 ORDER BY parity")) {
            for (int i = 0; i < SCATTER_REPEAT; i++) {
                order.setLong(1, lo);
                order.setLong(2, hi);
                List<Long> got = new ArrayList<>();
                try (ResultSet rs = order.executeQuery()) {
                    while (rs.next()) got.add(rs.getLong(1));
                }
                if (!got.equals(wantOrder)) fail("ORDER BY id DESC LIMIT 3 OFFSET 1: expected " + wantOrder + ", got " + got);

                agg.setLong(1, lo);
                agg.setLong(2, hi);
                try (ResultSet rs = agg.executeQuery()) {
                    if (!rs.next()) fail("aggregates: no row");
                    long n = rs.getLong(1), mn = rs.getLong(2), mx = rs.getLong(3);
                    if (n != keys.size() || mn != wantMin || mx != wantMax) {
                        fail("count, min, max: expected " + keys.size() + ", " + wantMin + ", " + wantMax
                            + ", got " + n + ", " + mn + ", " + mx);
                    }
                    sumGot = rs.getBigDecimal(4);
                    avgGot = rs.getBigDecimal(5);
                    if (sumGot == null || sumGot.compareTo(wantSum) != 0) {
                        fail("sum(id): expected " + wantSum + ", got " + (sumGot == null ? null : sumGot.toPlainString()));
                    }
                    if (avgGot == null || avgGot.compareTo(wantAvg) != 0) {
                        fail("avg(id): expected exactly " + wantAvg.toPlainString() + ", got "
                            + (avgGot == null ? null : avgGot.toPlainString()));
                    }
                    if (rs.next()) fail("aggregates: more than one row");
                }

                group.setLong(1, lo);
                group.setLong(2, hi);
                List<String> groups = new ArrayList<>();
                try (ResultSet rs = group.executeQuery()) {
                    while (rs.next()) groups.add(rs.getLong(1) + ":" + rs.getLong(2));
                }
                if (!groups.equals(wantGroups)) fail("GROUP BY id % 2: expected " + wantGroups + ", got " + groups);
            }
            named = agg.unwrap(PGStatement.class).isUseServerPrepare();
        }
        if (!named) fail("pgjdbc did not switch the aggregate query to a named server-side statement");
        ok("order/limit/offset, count/min/max/sum/avg (sum " + sumGot.toPlainString() + ", avg "
            + avgGot.toPlainString() + "), group by x" + SCATTER_REPEAT + ", named after 5");

        select.close();
        conn.close();
        System.out.println("PASS");
    }

    /**
     * SHARDGATE_MODE=isolation: while other shards are down or busy, statements keyed to the
     * healthy shard(s) of SHARDGATE_KEYS (rows with v = 'v<key>') and statements that need no
     * shard never fail.
     */
    static void isolation() throws Exception {
        List<Long> keys = new ArrayList<>();
        for (String k : System.getenv("SHARDGATE_KEYS").split(",")) keys.add(Long.parseLong(k));
        step = "connect";
        Connection conn = connect();
        ok("");
        step = "isolated";
        try (Statement st = conn.createStatement();
             PreparedStatement select = conn.prepareStatement("SELECT v FROM kv WHERE id = ?")) {
            for (int round = 0; round < REPEAT; round++) {
                try (ResultSet rs = st.executeQuery("SELECT 1")) {
                    if (!rs.next() || rs.getInt(1) != 1) fail("SELECT 1");
                }
                for (long k : keys) expectValue(select, k, "v" + k, "isolated");
            }
            if (!select.unwrap(PGStatement.class).isUseServerPrepare()) {
                fail("pgjdbc did not switch the point select to a named server-side statement");
            }
        }
        ok(REPEAT + " rounds of SELECT 1 and " + keys.size() + " keys, named after 5");
        conn.close();
        System.out.println("PASS");
    }

    public static void main(String[] args) {
        try {
            if ("isolation".equals(System.getenv("SHARDGATE_MODE"))) isolation(); else run();
        } catch (Deviation e) {
            System.out.println("FAIL " + step + ": " + e.getMessage());
            System.exit(1);
        } catch (Throwable e) {
            String state = e instanceof SQLException ? " (SQLSTATE " + ((SQLException) e).getSQLState() + ")" : "";
            System.out.println("FAIL " + step + ": " + e + state);
            System.exit(1);
        }
    }
}
