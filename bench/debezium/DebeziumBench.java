// Debezium's embedded engine as an outbox relay, for the benchmark: the
// PostgreSQL connector (pgoutput), the Outbox Event Router SMT, and an
// idempotent acks=all KafkaProducer. Each batch is acknowledged by the broker
// before its offsets are marked processed, so the slot is confirmed only after
// the acks (offset.flush.interval.ms later), as walrelay does.
//
//   java -cp classes:libs/* DebeziumBench engine.properties
//
// engine.properties holds the engine and connector properties; the broker is
// kafka.bootstrap.servers (not passed on to the engine's own use).

import io.debezium.engine.DebeziumEngine;
import io.debezium.engine.RecordChangeEvent;
import io.debezium.engine.format.ChangeEventFormat;
import io.debezium.embedded.Connect;
import java.io.FileReader;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.Properties;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.header.internals.RecordHeaders;
import org.apache.kafka.common.serialization.ByteArraySerializer;
import org.apache.kafka.connect.header.Header;
import org.apache.kafka.connect.source.SourceRecord;

public final class DebeziumBench {
  private DebeziumBench() {}

  // Text bytes of a Connect value (the router's key, payload and headers are strings here).
  private static byte[] bytes(Object v) {
    if (v == null) return null;
    if (v instanceof byte[] b) return b;
    return v.toString().getBytes(StandardCharsets.UTF_8);
  }

  public static void main(String[] args) throws Exception {
    Properties props = new Properties();
    try (FileReader r = new FileReader(args[0])) {
      props.load(r);
    }
    String prefix = props.getProperty("transforms.outbox.route.topic.replacement", "").replace("${routedByValue}", "");
    Properties kp = new Properties();
    kp.put("bootstrap.servers", props.getProperty("kafka.bootstrap.servers"));
    kp.put("acks", "all");
    kp.put("enable.idempotence", "true");
    kp.put("linger.ms", "5");
    kp.put("key.serializer", ByteArraySerializer.class.getName());
    kp.put("value.serializer", ByteArraySerializer.class.getName());
    props.remove("kafka.bootstrap.servers");
    KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(kp);

    DebeziumEngine<RecordChangeEvent<SourceRecord>> engine =
        DebeziumEngine.create(ChangeEventFormat.of(Connect.class))
            .using(props)
            .notifying((List<RecordChangeEvent<SourceRecord>> records,
                        DebeziumEngine.RecordCommitter<RecordChangeEvent<SourceRecord>> committer) -> {
              List<Future<RecordMetadata>> acks = new ArrayList<>(records.size());
              for (RecordChangeEvent<SourceRecord> ev : records) {
                SourceRecord r = ev.record();
                if (r.topic() == null || !r.topic().startsWith(prefix) || r.value() == null) continue;
                RecordHeaders headers = new RecordHeaders();
                for (Header h : r.headers()) headers.add(h.key(), bytes(h.value()));
                acks.add(producer.send(new ProducerRecord<>(r.topic(), null, r.timestamp(), bytes(r.key()),
                    bytes(r.value()), headers)));
              }
              try {
                for (Future<RecordMetadata> f : acks) f.get();
              } catch (java.util.concurrent.ExecutionException e) {
                throw new RuntimeException("could not publish a batch", e);
              }
              for (RecordChangeEvent<SourceRecord> ev : records) committer.markProcessed(ev);
              committer.markBatchFinished();
            })
            .using((success, message, error) -> {
              if (!success) System.err.println("engine stopped: " + message + (error == null ? "" : " " + error));
            })
            .build();
    ExecutorService executor = Executors.newSingleThreadExecutor();
    executor.execute(engine);
    executor.shutdown();  // awaitTermination below returns when the engine stops, also on failure
    Runtime.getRuntime().addShutdownHook(new Thread(() -> {
      try {
        engine.close();
        executor.awaitTermination(30, TimeUnit.SECONDS);
      } catch (Exception e) {
        System.err.println("could not stop the engine: " + e);
      }
      producer.close();
    }));
    executor.awaitTermination(Long.MAX_VALUE, TimeUnit.DAYS);
    producer.close();
    System.exit(1);  // the engine stopped by itself: a failure (a requested stop never gets here)
  }
}
