package etstore.dev;

import java.nio.file.Path;
import java.util.Map;
import java.util.concurrent.CountDownLatch;

import org.neo4j.configuration.GraphDatabaseSettings;
import org.neo4j.configuration.connectors.BoltConnector;
import org.neo4j.configuration.helpers.SocketAddress;
import org.neo4j.dbms.api.DatabaseManagementService;
import org.neo4j.dbms.api.DatabaseManagementServiceBuilder;
import org.neo4j.graphdb.QueryExecutionException;
import org.neo4j.io.ByteUnit;

/**
 * Neo4j Community 5 with the Bolt connector on loopback, for etstore's development and tests.
 *
 * <p>Arguments: data directory, host, port. The password of the built-in user {@code neo4j}
 * comes from the environment variable {@code ETSTORE_NEO4J_DEV_PASSWORD} (never from the
 * command line, so it does not show in process listings). Prints {@code READY} once Bolt
 * accepts connections and shuts the database down cleanly on SIGTERM.
 *
 * <p>No Cypher statement may read the server's files: {@code LOAD CSV FROM 'file:///...'} is
 * refused ({@code dbms.security.allow_csv_import_from_file_urls=false}), whatever the access
 * mode of the session. No plugin (APOC or other) is on the class path, so there is no file
 * export or import procedure either.
 */
public final class Neo4jDevServer {
    private Neo4jDevServer() {}

    public static void main(String[] args) throws InterruptedException {
        if (args.length != 3) {
            System.err.println("usage: Neo4jDevServer DATA_DIR HOST PORT");
            System.exit(2);
        }
        String password = System.getenv("ETSTORE_NEO4J_DEV_PASSWORD");
        if (password == null || password.length() < 8) {
            System.err.println("ETSTORE_NEO4J_DEV_PASSWORD must hold a password of at least 8 characters");
            System.exit(2);
        }
        DatabaseManagementService dbms = new DatabaseManagementServiceBuilder(Path.of(args[0]))
                .setConfig(BoltConnector.enabled, true)
                .setConfig(BoltConnector.listen_address, new SocketAddress(args[1], Integer.parseInt(args[2])))
                .setConfig(BoltConnector.encryption_level, BoltConnector.EncryptionLevel.DISABLED)
                .setConfig(GraphDatabaseSettings.auth_enabled, true)
                .setConfig(GraphDatabaseSettings.allow_file_urls, false)
                .setConfig(GraphDatabaseSettings.pagecache_memory, ByteUnit.mebiBytes(512))
                .build();
        CountDownLatch stopped = new CountDownLatch(1);
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            dbms.shutdown();
            stopped.countDown();
        }));
        try {
            dbms.database(GraphDatabaseSettings.SYSTEM_DATABASE_NAME).executeTransactionally(
                    "ALTER USER neo4j SET PASSWORD $password CHANGE NOT REQUIRED", Map.of("password", password));
        } catch (QueryExecutionException e) {
            if (!String.valueOf(e.getMessage()).contains("cannot be the same")) {  // a restart keeps it
                System.err.println("cannot set the dev password: " + e.getMessage());
                System.exit(1);  // runs the shutdown hook
            }
        }
        System.out.println("READY bolt://" + args[1] + ":" + args[2]);
        System.out.flush();
        stopped.await();
    }
}
