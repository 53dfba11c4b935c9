// pgjdbc batches and transactions over several shards: executeBatch with and without
// reWriteBatchedInserts (which turns a batch into multi-row INSERTs with bound parameters), with
// autocommit on and off, with one failing row, and a rolled back transaction over several
// shards. The same steps run through the router (SHARDGATE_URL) and directly on one Postgres
// with the same schema (SHARDGATE_DIRECT_URL); every observation must be the same.
// Environment: SHARDGATE_URL, SHARDGATE_DIRECT_URL (postgres://user:password@host:port/db),
// SHARDGATE_KEY_BASE. Prints each observation, then PASS; exits 1 with FAIL on a difference.

import java.net.URI;
import java.sql.BatchUpdateException;
import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.sql.Statement;
import java.util.ArrayList;
import java.util.List;

public class Batches {
    static long base;

    static Connection connect(String url, boolean rewrite) throws Exception {
        URI u = new URI(url);
        String[] auth = u.getUserInfo().split(":", 2);
        String jdbc = "jdbc:postgresql://" + u.getHost() + ":" + u.getPort() + u.getPath()
                + "?user=" + auth[0] + "&password=" + auth[1] + "&sslmode=disable"
                + "&reWriteBatchedInserts=" + rewrite;
        return DriverManager.getConnection(jdbc);
    }

    static long count(Connection c, long lo, long hi) throws SQLException {
        try (Statement s = c.createStatement();
             ResultSet r = s.executeQuery("SELECT count(*) FROM kv WHERE id BETWEEN " + (base + lo) + " AND " + (base + hi))) {
            r.next();
            return r.getLong(1);
        }
    }

    static String insertBatch(Connection c, long from, long to, Long duplicate) throws SQLException {
        try (PreparedStatement p = c.prepareStatement("INSERT INTO kv (id, v) VALUES (?, ?)")) {
            for (long i = from; i <= to; i++) {
                p.setLong(1, base + i);
                p.setString(2, "jdbc" + i);
                p.addBatch();
                if (duplicate != null && i == from + 3) {
                    p.setLong(1, base + duplicate);
                    p.setString(2, "dup");
                    p.addBatch();
                }
            }
            p.executeBatch();
            return "ok";
        } catch (BatchUpdateException e) {
            SQLException next = e.getNextException();
            return "error " + (next != null ? next.getSQLState() : e.getSQLState());
        }
    }

    static List<String> run(String url) throws Exception {
        List<String> seen = new ArrayList<>();
        for (boolean rewrite : new boolean[] {false, true}) {
            long off = rewrite ? 1000 : 0;
            try (Connection c = connect(url, rewrite)) {
                // Autocommit on: one batch of 100 rows over every shard.
                seen.add("rewrite=" + rewrite + " batch " + insertBatch(c, off + 1, off + 100, null));
                seen.add("rewrite=" + rewrite + " count " + count(c, off + 1, off + 100));
                // One failing row: nothing of the batch remains.
                seen.add("rewrite=" + rewrite + " failing " + insertBatch(c, off + 101, off + 140, off + 5));
                seen.add("rewrite=" + rewrite + " after failure " + count(c, off + 101, off + 140));
                // Autocommit off: a batch and updates over several shards, committed.
                c.setAutoCommit(false);
                seen.add("rewrite=" + rewrite + " tx batch " + insertBatch(c, off + 201, off + 260, null));
                try (PreparedStatement u = c.prepareStatement("UPDATE kv SET v = v || '!' WHERE id = ?")) {
                    for (long i = off + 1; i <= off + 10; i++) {
                        u.setLong(1, base + i);
                        u.addBatch();
                    }
                    int total = 0;
                    for (int n : u.executeBatch()) total += n;
                    seen.add("rewrite=" + rewrite + " tx updates " + total);
                }
                seen.add("rewrite=" + rewrite + " tx count " + count(c, off + 1, off + 300));
                // A fetch size with autocommit off: a portal read a few rows at a time (the
                // router merges it step by step over the shards), sorted and in shard order,
                // with other statements of the transaction in between.
                for (String order : new String[] {" ORDER BY id DESC", ""}) {
                    try (PreparedStatement q = c.prepareStatement(
                            "SELECT id, v FROM kv WHERE id BETWEEN ? AND ?" + order);
                         PreparedStatement u = c.prepareStatement("UPDATE kv SET v = v || '.' WHERE id = ?")) {
                        q.setFetchSize(7);
                        q.setLong(1, base + off + 1);
                        q.setLong(2, base + off + 300);
                        long rows = 0, sum = 0;
                        StringBuilder first = new StringBuilder();
                        try (ResultSet r = q.executeQuery()) {
                            while (r.next()) {
                                long id = r.getLong(1);
                                rows++;
                                sum += id - base;
                                if (!order.isEmpty() && rows <= 5) first.append(id - base).append(',');
                                if (rows % 40 == 0) {
                                    // The same row whatever the order the rows came in.
                                    u.setLong(1, base + off + 1);
                                    u.executeUpdate();
                                }
                            }
                        }
                        seen.add("rewrite=" + rewrite + " fetch size" + order + " " + rows + " rows, sum " + sum + ", first " + first);
                    }
                }
                c.commit();
                // The same, rolled back: nothing of it anywhere.
                seen.add("rewrite=" + rewrite + " rollback batch " + insertBatch(c, off + 301, off + 340, null));
                try (Statement s = c.createStatement()) {
                    seen.add("rewrite=" + rewrite + " rollback delete " + s.executeUpdate(
                            "DELETE FROM kv WHERE id BETWEEN " + (base + off + 1) + " AND " + (base + off + 50)));
                }
                c.rollback();
                c.setAutoCommit(true);
                seen.add("rewrite=" + rewrite + " after rollback " + count(c, off + 1, off + 400));
                try (Statement s = c.createStatement();
                     ResultSet r = s.executeQuery("SELECT id, v FROM kv WHERE id BETWEEN "
                             + (base + off + 1) + " AND " + (base + off + 10) + " ORDER BY id")) {
                    StringBuilder b = new StringBuilder();
                    while (r.next()) b.append(r.getString(2)).append(',');
                    seen.add("rewrite=" + rewrite + " values " + b);
                }
            }
        }
        return seen;
    }

    public static void main(String[] args) throws Exception {
        base = Long.parseLong(System.getenv("SHARDGATE_KEY_BASE"));
        List<String> direct = run(System.getenv("SHARDGATE_DIRECT_URL"));
        List<String> routed = run(System.getenv("SHARDGATE_URL"));
        for (int i = 0; i < Math.max(direct.size(), routed.size()); i++) {
            String d = i < direct.size() ? direct.get(i) : "(missing)";
            String r = i < routed.size() ? routed.get(i) : "(missing)";
            System.out.println((d.equals(r) ? "ok " : "DIFFERENT ") + r);
            if (!d.equals(r)) {
                System.out.println("FAIL through the router: " + r + ", directly: " + d);
                System.exit(1);
            }
        }
        System.out.println("PASS");
    }
}
