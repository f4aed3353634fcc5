// The read path the columnar readers share (common/parquet_column's pages, common/arrow_column's
// record batches): a file's values come in units, each decoded whole; a read walks the units its
// range covers, and the last unit decoded is kept for the next read (reads are mostly in order,
// a few per unit). Safe to call from several threads.
#ifndef LATENTD_COMMON_DECODED_UNITS_H_
#define LATENTD_COMMON_DECODED_UNITS_H_

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace latentd {

// `Unit` has first_value and values: where its values sit in the stream (first_value ascending
// over the units, which cover the stream); `Decoded` is what decoding one gives.
template <typename Unit, typename Decoded>
class DecodedUnits {
 public:
  // Fills a Decoded with the unit's values; an error ends the read.
  using Decode = std::function<absl::Status(const Unit&, Decoded*)>;
  // Takes `n` values from `offset` in a unit's decoded values, in stream order.
  using Take = std::function<void(const Decoded&, int64_t offset, int64_t n)>;

  // Values [first, first + count) of the `total` the units hold; OUT_OF_RANGE (naming `what`)
  // outside them.
  absl::Status ForEach(const std::vector<Unit>& units, int64_t total, const std::string& what,
                       int64_t first, int64_t count, const Decode& decode, const Take& take) const {
    if (first < 0 || count < 0 || first > total - count) {
      return absl::OutOfRangeError(absl::StrCat("values [", first, ", ", first + count,
                                                ") outside the ", total, " of ", what));
    }
    while (count > 0) {
      auto it = std::upper_bound(units.begin(), units.end(), first,
                                 [](int64_t v, const Unit& u) { return v < u.first_value; });
      const int index = static_cast<int>(it - units.begin()) - 1;
      const Unit& unit = units[index];
      std::shared_ptr<const Decoded> values;
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (last_index_ == index) values = last_;
      }
      if (values == nullptr) {
        auto decoded = std::make_shared<Decoded>();
        if (absl::Status s = decode(unit, decoded.get()); !s.ok()) return s;
        values = decoded;
        std::lock_guard<std::mutex> lock(mu_);
        last_index_ = index;
        last_ = values;
      }
      const int64_t offset = first - unit.first_value;
      const int64_t n = std::min(count, unit.values - offset);
      take(*values, offset, n);
      first += n;
      count -= n;
    }
    return absl::OkStatus();
  }

 private:
  mutable std::mutex mu_;
  mutable int last_index_ = -1;
  mutable std::shared_ptr<const Decoded> last_;
};

}  // namespace latentd

#endif  // LATENTD_COMMON_DECODED_UNITS_H_
