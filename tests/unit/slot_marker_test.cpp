// The slot marker in the publication's comment: what a restart reads to tell
// a lost slot from a first start, and an interrupted snapshot from a slot to
// stream from.
#include <catch2/catch.hpp>

#include "walrelay/source/catalog.hpp"

using walrelay::SlotMarker;

TEST_CASE("slot marker: written and read back, the owner's lines kept, a pending snapshot recorded", "[catalog]") {
  SlotMarker pending{"s1", std::nullopt, "2026-12-03T03:00:00Z", "7300000000000000001", true, {}, {}, {}, {}, {}, {}, false};
  const std::string comment = walrelay::with_slot_marker("the owner's words\nsecond line", pending);
  CHECK(comment == "the owner's words\nsecond line\nwalrelay.slot=s1 created_at=2026-12-03T03:00:00Z "
                   "system=7300000000000000001 snapshot=pending");
  auto markers = walrelay::parse_slot_markers(comment);
  REQUIRE(markers.size() == 1);
  CHECK(markers[0].snapshot_pending);
  CHECK_FALSE(markers[0].created_lsn);

  // The snapshot done: the same line replaced, pending gone.
  SlotMarker done{"s1", pgoutput::Lsn{0x16B3740000ULL}, "2026-12-03T03:01:00Z", "7300000000000000001", false, {}, {}, {}, {}, {}, {}, false};
  const std::string after = walrelay::with_slot_marker(comment, done);
  CHECK(after.find("snapshot=") == std::string::npos);
  CHECK(after.rfind("the owner's words\nsecond line\n", 0) == 0);
  markers = walrelay::parse_slot_markers(after);
  REQUIRE(markers.size() == 1);
  CHECK_FALSE(markers[0].snapshot_pending);
  CHECK(markers[0].created_lsn == pgoutput::Lsn{0x16B3740000ULL});
}

TEST_CASE("slot marker: a pending snapshot's view is kept while pending, and only a pg_snapshot's text is read",
          "[catalog]") {
  SlotMarker pending{"s1", pgoutput::Lsn{0x16B3740000ULL}, "2026-12-03T03:00:00Z", "7300000000000000001", true,
                     "7461:7470:7461,7463,7469", "0f1e2d3c4b5a6978", {}, {}, {}, {}, false};
  const std::string comment = walrelay::with_slot_marker("", pending);
  CHECK(comment.find(" snapshot=pending snapshot_xids=7461:7470:7461,7463,7469") != std::string::npos);
  auto markers = walrelay::parse_slot_markers(comment);
  REQUIRE(markers.size() == 1);
  CHECK(markers[0].snapshot_xids == "7461:7470:7461,7463,7469");
  CHECK(markers[0].snapshot_files == "0f1e2d3c4b5a6978");
  CHECK(markers[0].created_lsn == pgoutput::Lsn{0x16B3740000ULL});
  // Done: the view goes with the pending state.
  pending.snapshot_pending = false;
  CHECK(walrelay::with_slot_marker(comment, pending).find("snapshot_xids") == std::string::npos);
  // A hand-edited comment cannot put SQL where the view goes.
  markers = walrelay::parse_slot_markers("walrelay.slot=s1 snapshot=pending snapshot_xids=1:2:');DROP");
  REQUIRE(markers.size() == 1);
  CHECK(markers[0].snapshot_xids.empty());
  CHECK(walrelay::is_pg_snapshot_text("100:100:"));
  CHECK_FALSE(walrelay::is_pg_snapshot_text("100:100"));
  CHECK_FALSE(walrelay::is_pg_snapshot_text(":1:2"));
  CHECK_FALSE(walrelay::is_pg_snapshot_text(""));
  // What pg_snapshot's input would refuse: xmin past xmax, xips out of
  // range or order, an empty item.
  CHECK_FALSE(walrelay::is_pg_snapshot_text("5:3:"));
  CHECK_FALSE(walrelay::is_pg_snapshot_text("10:20:15,12"));
  CHECK_FALSE(walrelay::is_pg_snapshot_text("10:20:9"));
  CHECK_FALSE(walrelay::is_pg_snapshot_text("10:20:20"));
  CHECK_FALSE(walrelay::is_pg_snapshot_text(",1:2:"));
  CHECK_FALSE(walrelay::is_pg_snapshot_text("1:2:,"));
  CHECK_FALSE(walrelay::is_pg_snapshot_text("0:2:"));
  CHECK_FALSE(walrelay::is_pg_snapshot_text("99999999999999999999999:1:"));
  CHECK(walrelay::is_pg_snapshot_text("10:20:10,11,19"));
}

TEST_CASE("slot marker: a missing slot is a problem unless its snapshot never finished", "[catalog]") {
  walrelay::Config config;
  walrelay::ServerFacts facts;
  facts.system = "7300000000000000001";
  facts.marker = SlotMarker{config.slot_name, pgoutput::Lsn{0x100}, "2026-12-03T03:00:00Z", facts.system, false, {}, {}, {}, {}, {}, {}, false};
  auto problem = walrelay::slot_problem(config, facts);
  REQUIRE(problem);
  CHECK(problem->find("--reset-slot") != std::string::npos);
  facts.marker->snapshot_pending = true;
  CHECK_FALSE(walrelay::slot_problem(config, facts));
  // A pending snapshot whose slot was made (its view recorded) and is gone:
  // a new slot would skip what the old one held.
  facts.marker->snapshot_xids = "10:20:";
  auto lost = walrelay::slot_problem(config, facts);
  REQUIRE(lost);
  CHECK(lost->find("--reset-slot") != std::string::npos);
  CHECK(lost->find("left no row") != std::string::npos);
}

TEST_CASE("slot marker: retention's floors are kept per table oid, and a hand-edited list is ignored whole",
          "[catalog]") {
  SlotMarker marker{"s1", pgoutput::Lsn{0x16B3740000ULL}, "2026-12-03T03:00:00Z", "7300000000000000001", false, {}, {}, {}, {}, {}, {}, false};
  marker.retention_floors = {{16384, 755}, {16390, 4294967301ULL}};
  const std::string comment = walrelay::with_slot_marker("", marker);
  CHECK(comment.find(" retention_floors=16384:755,16390:4294967301") != std::string::npos);
  auto markers = walrelay::parse_slot_markers(comment);
  REQUIRE(markers.size() == 1);
  CHECK(markers[0].retention_floors == marker.retention_floors);
  // Rewritten for a new slot (no floors given): none kept.
  SlotMarker fresh{"s1", pgoutput::Lsn{0x16B3750000ULL}, "2026-12-04T03:00:00Z", "7300000000000000001", false, {}, {}, {}, {}, {}, {}, false};
  CHECK(walrelay::with_slot_marker(comment, fresh).find("retention_floors") == std::string::npos);
  for (const char* bad : {"16384:755,x:1", "16384:", ":755", "99999999999:1", "16384:755;DROP", "16384-755"}) {
    markers = walrelay::parse_slot_markers(std::string("walrelay.slot=s1 retention_floors=") + bad);
    REQUIRE(markers.size() == 1);
    CHECK(markers[0].retention_floors.empty());
  }
}

TEST_CASE("slot marker: the slot's view at its consistent point is kept, said sent once an initial snapshot sent "
          "it, and a view edited into something else is not kept",
          "[catalog]") {
  SlotMarker marker{"s1", pgoutput::Lsn{0x16B3740000ULL}, "2026-12-03T03:00:00Z", "7300000000000000001", false, {}, {}, {}, {}, {}, {}, false};
  marker.slot_view = "750:760:751,755";
  marker.retention_floors = {{16384, 750}};
  std::string comment = walrelay::with_slot_marker("", marker);
  CHECK(comment.find(" slot_view=750:760:751,755") != std::string::npos);
  CHECK(comment.find("view_sent") == std::string::npos);
  auto markers = walrelay::parse_slot_markers(comment);
  REQUIRE(markers.size() == 1);
  CHECK(markers[0].slot_view == marker.slot_view);
  CHECK(markers[0].retention_floors == marker.retention_floors);
  CHECK_FALSE(markers[0].view_sent);
  marker.view_sent = true;
  markers = walrelay::parse_slot_markers(walrelay::with_slot_marker(comment, marker));
  REQUIRE(markers.size() == 1);
  CHECK(markers[0].view_sent);
  // Before a slot is made again: nothing of the old one's vouches for it.
  const SlotMarker cleared = walrelay::without_slot_view(markers[0]);
  CHECK(cleared.slot_view.empty());
  CHECK(cleared.retention_floors.empty());
  CHECK_FALSE(cleared.view_sent);
  CHECK(cleared.created_lsn == marker.created_lsn);
  for (const char* bad : {"slot_view=750:760:x", "slot_view=750;DROP", "slot_view=760:750:", "slot_view=750:760:755,751"}) {
    markers = walrelay::parse_slot_markers(std::string("walrelay.slot=s1 ") + bad);
    REQUIRE(markers.size() == 1);
    CHECK(markers[0].slot_view.empty());
  }
}

TEST_CASE("slot marker: an operator's pause is kept beside the slot's fields, and a line that holds only a pause "
          "records no slot",
          "[catalog]") {
  SlotMarker slot{"s1", pgoutput::Lsn{0x16B3740000ULL}, "2026-12-03T03:00:00Z", "7300000000000000001", false,
                  {}, {}, {}, {}, "2026-12-04T22:00:00Z", {}, false};
  const std::string comment = walrelay::with_slot_marker("", slot);
  CHECK(comment.find(" paused=2026-12-04T22:00:00Z") != std::string::npos);
  auto markers = walrelay::parse_slot_markers(comment);
  REQUIRE(markers.size() == 1);
  CHECK(markers[0].paused_since == "2026-12-04T22:00:00Z");
  CHECK(markers[0].records_slot());
  // Only a pause (asked for before walrelay recorded the slot): no slot.
  markers = walrelay::parse_slot_markers("walrelay.slot=s2 paused=2026-12-04T22:00:00Z");
  REQUIRE(markers.size() == 1);
  CHECK_FALSE(markers[0].records_slot());
  // A pause's value is a time, nothing else.
  markers = walrelay::parse_slot_markers("walrelay.slot=s3 created_at=2026-12-03T03:00:00Z paused=x;DROP");
  REQUIRE(markers.size() == 1);
  CHECK(markers[0].paused_since.empty());
}
