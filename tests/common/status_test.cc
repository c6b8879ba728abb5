#include "distca/status.h"

#include <gtest/gtest.h>

namespace distca {
namespace {

Status Fails() { return Status::InvalidArgument("x is 3"); }

Status Propagates() {
  DISTCA_RETURN_IF_ERROR(Status::Ok());
  DISTCA_RETURN_IF_ERROR(Fails());
  return Status::Internal("not reached");
}

TEST(StatusTest, DefaultIsOk) {
  Status s;
  EXPECT_TRUE(s.ok());
  EXPECT_EQ(s.ToString(), "OK");
}

TEST(StatusTest, CarriesCodeAndMessage) {
  const Status s = Fails();
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.ToString(), "invalid argument: x is 3");
  EXPECT_EQ(s.WithContext("loading plan").message(), "loading plan: x is 3");
}

TEST(StatusTest, ReturnIfErrorPropagatesFirstFailure) { EXPECT_EQ(Propagates().message(), "x is 3"); }

}  // namespace
}  // namespace distca
