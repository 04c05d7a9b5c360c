// The keeper's reading of sd_notify datagrams (broker/keeper/notify_message.h).
#include <gtest/gtest.h>

#include "keeper/notify_message.h"

namespace membroker::broker::keeper {
namespace {

TEST(NotifyMessage, WhatTheBrokerSends) {
  std::string error;
  auto m = ParseNotifyMessage("READY=1\nSTATUS=serving /run/membroker/broker.sock", &error);
  ASSERT_TRUE(m) << error;
  EXPECT_TRUE(m->ready);
  EXPECT_EQ(m->status, "serving /run/membroker/broker.sock");
  m = ParseNotifyMessage("FDSTORE=1\nFDNAME=state-3", &error);
  ASSERT_TRUE(m) << error;
  EXPECT_TRUE(m->fd_store);
  EXPECT_EQ(m->fd_name, "state-3");
  m = ParseNotifyMessage("FDSTOREREMOVE=1\nFDNAME=state-2\n", &error);
  ASSERT_TRUE(m) << error;
  EXPECT_TRUE(m->fd_store_remove);
  m = ParseNotifyMessage("FDSTORE=1", &error);
  ASSERT_TRUE(m) << error;
  EXPECT_EQ(m->fd_name, "stored");  // systemd's default
  m = ParseNotifyMessage("WATCHDOG=1\nMAINPID=7\nSTOPPING=1", &error);
  ASSERT_TRUE(m) << error;
  EXPECT_TRUE(m->stopping);
  EXPECT_FALSE(m->ready);
}

TEST(NotifyMessage, RefusalsSayWhy) {
  for (const char* bad : {"READY", "=1", "READY=2", "FDSTORE=yes", "FDSTORE=1\nFDNAME=a:b",
                          "FDSTORE=1\nFDNAME=", "FDSTORE=1\nFDNAME=a b", "FDSTORE=1\nFDSTOREREMOVE=1\nFDNAME=x"}) {
    std::string error;
    EXPECT_FALSE(ParseNotifyMessage(bad, &error)) << bad;
    EXPECT_FALSE(error.empty()) << bad;
  }
  std::string error;
  EXPECT_FALSE(ParseNotifyMessage("FDSTORE=1\nFDNAME=" + std::string(256, 'a'), &error));
  EXPECT_TRUE(ParseNotifyMessage("FDSTORE=1\nFDNAME=" + std::string(255, 'a'), &error));
  EXPECT_FALSE(ParseNotifyMessage(std::string(kMaxNotifyBytes + 1, 'a'), &error));
}

}  // namespace
}  // namespace membroker::broker::keeper
