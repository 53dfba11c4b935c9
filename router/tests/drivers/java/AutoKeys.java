// pgjdbc inserting rows whose key the router gives (the sharded identity table autos):
// RETURN_GENERATED_KEYS (pgjdbc appends RETURNING *) on a prepared INSERT run past
// prepareThreshold (a named server statement), executeBatch with generated keys, with and
// without reWriteBatchedInserts (multi-row VALUES), and each row found by the key it got. The
// same steps run through the router (SHARDGATE_URL) and directly on one Postgres with the same
// schema (SHARDGATE_DIRECT_URL); every observation (keys aside) must be the same.
// Environment: SHARDGATE_URL, SHARDGATE_DIRECT_URL. Prints each observation, then PASS; exits 1
// with FAIL on a difference.

import java.net.URI;
import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.sql.Statement;
import java.util.ArrayList;
import java.util.HashSet;
import java.util.List;

public class AutoKeys {
    static Connection connect(String url, boolean rewrite) throws Exception {
        URI u = new URI(url);
        String[] auth = u.getUserInfo().split(":", 2);
        String jdbc = "jdbc:postgresql://" + u.getHost() + ":" + u.getPort() + u.getPath()
                + "?user=" + auth[0] + "&password=" + auth[1] + "&sslmode=disable"
                + "&reWriteBatchedInserts=" + rewrite;
        return DriverManager.getConnection(jdbc);
    }

    static List<Long> keys(PreparedStatement ps) throws SQLException {
        List<Long> out = new ArrayList<>();
        try (ResultSet r = ps.getGeneratedKeys()) {
            while (r.next()) {
                out.add(r.getLong("id"));
            }
        }
        return out;
    }

    static String found(Connection c, List<Long> ids) throws SQLException {
        StringBuilder sb = new StringBuilder();
        try (PreparedStatement ps = c.prepareStatement("SELECT v, n FROM autos WHERE id = ?")) {
            for (long id : ids) {
                ps.setLong(1, id);
                try (ResultSet r = ps.executeQuery()) {
                    sb.append(r.next() ? r.getString(1) + "/" + r.getInt(2) : "missing").append(' ');
                }
            }
        }
        return sb.toString().trim();
    }

    static List<String> steps(String url, String tag) throws Exception {
        List<String> seen = new ArrayList<>();
        for (boolean rewrite : new boolean[] {false, true}) {
            String t = tag + (rewrite ? "r" : "p");
            try (Connection c = connect(url, rewrite)) {
                List<Long> ids = new ArrayList<>();
                try (PreparedStatement ps = c.prepareStatement(
                        "INSERT INTO autos (v, n) VALUES (?, ?)", Statement.RETURN_GENERATED_KEYS)) {
                    for (int i = 0; i < 8; i++) {
                        ps.setString(1, t + i);
                        ps.setInt(2, i);
                        ps.executeUpdate();
                        ids.addAll(keys(ps));
                    }
                    for (int i = 0; i < 15; i++) {
                        ps.setString(1, t + "b" + i);
                        ps.setInt(2, 100 + i);
                        ps.addBatch();
                    }
                    int[] counts = ps.executeBatch();
                    int total = 0;
                    for (int n : counts) {
                        total += n < 0 ? 1 : n;
                    }
                    seen.add("rewrite=" + rewrite + " batch rows " + total);
                    ids.addAll(keys(ps));
                }
                seen.add("rewrite=" + rewrite + " keys " + ids.size() + " distinct " + new HashSet<>(ids).size());
                seen.add("rewrite=" + rewrite + " found " + found(c, ids));
                try (Statement s = c.createStatement()) {
                    StringBuilder list = new StringBuilder();
                    for (long id : ids) {
                        list.append(list.length() == 0 ? "" : ",").append(id);
                    }
                    seen.add("rewrite=" + rewrite + " deleted " + s.executeUpdate("DELETE FROM autos WHERE id IN (" + list + ")"));
                }
            }
        }
        return seen;
    }

    public static void main(String[] args) throws Exception {
        List<String> through = steps(System.getenv("SHARDGATE_URL"), "jr");
        List<String> direct = steps(System.getenv("SHARDGATE_DIRECT_URL"), "jr");
        boolean failed = through.size() != direct.size();
        for (int i = 0; i < Math.min(through.size(), direct.size()); i++) {
            boolean same = through.get(i).equals(direct.get(i));
            System.out.println((same ? "ok   " : "DIFF ") + through.get(i) + (same ? "" : "  (direct: " + direct.get(i) + ")"));
            failed |= !same;
        }
        if (failed) {
            System.out.println("FAIL pgjdbc with keys the router gives differs from one Postgres");
            System.exit(1);
        }
        System.out.println("PASS");
    }
}
