// What a model is conditioned on, fixed at compile time: a list of conditions and the fuser that
// brings them into the transformer, AudioCraft's conditioning in etude's configuration.
//
//   using conds = etude::conditions<etude::cond::attribute<"key", 24>, etude::cond::attribute<"mode", 2>,
//                                   etude::cond::embedding<"text", 384, 64>, etude::fuse::cross>;
//   using lm = etude::model<etude::shape{...}, etude::pattern::delay<0, 1, 2, 3>, conds>;
//
// - cond::attribute<Name, Values, Dim, Unknown>: a categorical attribute (AudioCraft's LUT
//   conditioner): a learned table of Values rows of width Dim, then a learned projection (with
//   bias) to the model width. One condition position. Values are named by string in the data; a
//   value the vocabulary does not know is refused (unknown_value::error) or taken as the null
//   condition (unknown_value::null).
// - cond::embedding<Name, Width, MaxLen>: a precomputed sequence embedding (T5, CLAP, MiniLM — any
//   encoder run outside etude), up to MaxLen positions of Width values with a padding mask, through
//   a learned projection (with bias) to the model width. MaxLen condition positions.
// - the fuser: fuse::cross (MusicGen's default: cross-attention in every layer, pre-LN on the
//   query, keys and values from the raw condition tensor, padded condition positions masked),
//   fuse::cross_unmasked (AudioCraft's exact behaviour: no mask, padded positions are zero vectors
//   that still take part in the softmax), fuse::sum (the condition added to every input position;
//   attributes only, since an attribute has one position), fuse::prepend (AudioCraft's 'prepend':
//   the condition tensor's LC rows placed in front of the token embeddings, positions added over
//   all LC + S rows, causal self-attention over them, the LC rows' logits dropped; no mask, so null
//   and padded positions are zero rows that still sit in the sequence and take positions of
//   shape.max_len). AudioCraft prepends condition after condition, so with several prepended
//   conditions its sequence starts with the last one; etude keeps the list order (list them in
//   reverse to match such a model).
//
// A dropped or missing condition is AudioCraft's null condition: zero vectors, so cross-attention
// adds exactly zero when every condition is null. The model lays the conditions out in list order,
// each at its positions of one condition tensor (B, positions, dim).
// Not for: the learned tensors (model/params.hpp), dropout (train/), or reading condition data (data/).
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <string>
#include <string_view>
#include <type_traits>

namespace etude {

// A string usable as a template argument: cond::attribute<"key", 24>.
template <std::size_t N>
struct fixed_string {
  char value[N]{};
  constexpr fixed_string(const char (&s)[N]) { std::copy_n(s, N, value); }  // NOLINT: implicit on purpose
  constexpr std::string_view view() const { return {value, N - 1}; }
  constexpr const char* c_str() const { return value; }
  constexpr bool operator==(const fixed_string&) const = default;
};

namespace cond {

struct condition_tag {};

enum class unknown_value : unsigned char { error, null };

enum class condition_kind : unsigned char { attribute, embedding };

template <fixed_string Name, int Values, int Dim = 64, unknown_value Unknown = unknown_value::error>
struct attribute : condition_tag {
  static_assert(Name.view().size() > 0, "cond::attribute: give the attribute a name, e.g. attribute<\"key\", 24>");
  static_assert(Values >= 1, "cond::attribute<Name, Values>: Values (the number of distinct values) must be >= 1");
  static_assert(Dim >= 1, "cond::attribute<Name, Values, Dim>: Dim (the table width) must be >= 1");
  static constexpr condition_kind kind = condition_kind::attribute;
  static constexpr const char* name = Name.c_str();
  static constexpr int values = Values;
  static constexpr int width = Dim;      // the table's width, the projection's input
  static constexpr int positions = 1;    // condition positions it occupies
  static constexpr unknown_value unknown = Unknown;
};

template <fixed_string Name, int Width, int MaxLen>
struct embedding : condition_tag {
  static_assert(Name.view().size() > 0, "cond::embedding: give the embedding a name, e.g. embedding<\"text\", 384, 64>");
  static_assert(Width >= 1, "cond::embedding<Name, Width, MaxLen>: Width (values per position) must be >= 1");
  static_assert(MaxLen >= 1, "cond::embedding<Name, Width, MaxLen>: MaxLen (the most positions) must be >= 1");
  static constexpr condition_kind kind = condition_kind::embedding;
  static constexpr const char* name = Name.c_str();
  static constexpr int values = 0;
  static constexpr int width = Width;
  static constexpr int positions = MaxLen;
  static constexpr unknown_value unknown = unknown_value::error;
};

}  // namespace cond

namespace fuse {

struct fuser_tag {};

enum class method : unsigned char { none, cross, sum, prepend };

struct cross : fuser_tag {
  static constexpr method how = method::cross;
  static constexpr bool mask_padding = true;
  static constexpr const char* name = "cross";
};
struct cross_unmasked : fuser_tag {
  static constexpr method how = method::cross;
  static constexpr bool mask_padding = false;
  static constexpr const char* name = "cross_unmasked";
};
struct sum : fuser_tag {
  static constexpr method how = method::sum;
  static constexpr bool mask_padding = false;
  static constexpr const char* name = "sum";
};
struct prepend : fuser_tag {
  static constexpr method how = method::prepend;
  static constexpr bool mask_padding = false;  // AudioCraft's prepend takes no mask
  static constexpr const char* name = "prepend";
};

}  // namespace fuse

// One condition as the model and the data see it, without its type: kind, name, values or width,
// positions, and where it sits (its first position in the condition tensor; its index among the
// attributes or among the embeddings; its offset among the embeddings' values per example).
struct condition_desc {
  cond::condition_kind kind;
  const char* name;
  int values;     // attribute: the number of values; embedding: 0
  int width;      // attribute: table width; embedding: values per position
  int positions;  // 1 for an attribute, MaxLen for an embedding
  cond::unknown_value unknown;
  int first_position;  // in the condition tensor
  int slot;            // index among the attributes, or among the embeddings
  long long input_offset;  // embeddings: values before this one in an example's embedding input
  int mask_offset;         // embeddings: positions before this one in an example's embedding mask
};

namespace detail {
template <class F, class... Cs>
struct pick_fuser {
  using type = F;
};
template <class F, class C, class... Cs>
struct pick_fuser<F, C, Cs...> {
  using type = std::conditional_t<std::is_base_of_v<fuse::fuser_tag, C>, C, typename pick_fuser<F, Cs...>::type>;
};
}  // namespace detail

// conditions<Cs...>: conditions in any order, and at most one fuser among them (default
// fuse::cross).
template <class... Cs>
struct conditions {
  static_assert(((std::is_base_of_v<cond::condition_tag, Cs> || std::is_base_of_v<fuse::fuser_tag, Cs>) && ...),
                "etude::conditions<...>: every argument must be a condition (cond::attribute<\"name\", values>, "
                "cond::embedding<\"name\", width, max_len>) or a fuser (fuse::cross, fuse::cross_unmasked, fuse::sum, "
                "fuse::prepend)");
  static_assert((0 + ... + (std::is_base_of_v<fuse::fuser_tag, Cs> ? 1 : 0)) <= 1,
                "etude::conditions<...>: name at most one fuser (fuse::cross, fuse::cross_unmasked, fuse::sum or "
                "fuse::prepend)");

  using fuser = typename detail::pick_fuser<fuse::cross, Cs...>::type;
  static constexpr int count = (0 + ... + (std::is_base_of_v<cond::condition_tag, Cs> ? 1 : 0));
  static_assert(count >= 1, "etude::conditions<...>: list at least one condition (or use etude::no_conditions)");

 private:
  template <class C>
  static constexpr void add(std::array<condition_desc, count>& out, int& i, int& pos, int& attrs, int& embs,
                            long long& input, int& mask) {
    if constexpr (std::is_base_of_v<cond::condition_tag, C>) {
      const bool attr = C::kind == cond::condition_kind::attribute;
      out[static_cast<std::size_t>(i++)] =
          condition_desc{C::kind, C::name, C::values, C::width, C::positions, C::unknown, pos, attr ? attrs : embs,
                         attr ? 0 : input, attr ? 0 : mask};
      pos += C::positions;
      if (attr) {
        ++attrs;
      } else {
        ++embs;
        input += static_cast<long long>(C::width) * C::positions;
        mask += C::positions;
      }
    }
  }
  static constexpr std::array<condition_desc, count> make() {
    std::array<condition_desc, count> out{};
    int i = 0, pos = 0, attrs = 0, embs = 0, mask = 0;
    long long input = 0;
    (add<Cs>(out, i, pos, attrs, embs, input, mask), ...);
    return out;
  }

 public:
  static constexpr std::array<condition_desc, count> list = make();
  static constexpr int attributes = [] {
    int n = 0;
    for (const auto& c : list) n += c.kind == cond::condition_kind::attribute ? 1 : 0;
    return n;
  }();
  static constexpr int embeddings = count - attributes;
  // Positions of the condition tensor (B, positions, D): one per attribute, MaxLen per embedding.
  static constexpr int positions = [] {
    int n = 0;
    for (const auto& c : list) n += c.positions;
    return n;
  }();
  // Values of one example's embedding input (every embedding's MaxLen x Width, in list order) and
  // positions of its embedding mask.
  static constexpr long long embedding_values = [] {
    long long n = 0;
    for (const auto& c : list)
      if (c.kind == cond::condition_kind::embedding) n += static_cast<long long>(c.width) * c.positions;
    return n;
  }();
  static constexpr int embedding_positions = positions - attributes;

  static constexpr bool has_duplicate_names() {
    for (std::size_t i = 0; i < list.size(); ++i)
      for (std::size_t j = i + 1; j < list.size(); ++j)
        if (std::string_view(list[i].name) == std::string_view(list[j].name)) return true;
    return false;
  }
  static_assert(!has_duplicate_names(), "etude::conditions<...>: two conditions share a name; give each its own");
  static_assert(fuser::how != fuse::method::sum || embeddings == 0,
                "fuse::sum adds each condition to every position, so it takes cond::attribute only: use fuse::cross "
                "or fuse::prepend for a cond::embedding");

  static std::string describe() {
    std::string s = "conditions<";
    for (const auto& c : list) {
      s += c.kind == cond::condition_kind::attribute
               ? "attribute<" + std::string(c.name) + ", " + std::to_string(c.values) + ", " + std::to_string(c.width) +
                     (c.unknown == cond::unknown_value::null ? ", null" : "") + ">, "
               : "embedding<" + std::string(c.name) + ", " + std::to_string(c.width) + ", " +
                     std::to_string(c.positions) + ">, ";
    }
    return s + "fuse::" + fuser::name + ">";
  }
};

// The unconditioned model: no condition tensor, no fuser, nothing learned for conditions.
struct no_conditions {
  using fuser = void;
  static constexpr int count = 0, attributes = 0, embeddings = 0, positions = 0, embedding_positions = 0;
  static constexpr long long embedding_values = 0;
  static constexpr std::array<condition_desc, 0> list{};
  static std::string describe() { return "none"; }
};

template <class C>
inline constexpr bool is_conditions = false;
template <class... Cs>
inline constexpr bool is_conditions<conditions<Cs...>> = true;
template <>
inline constexpr bool is_conditions<no_conditions> = true;

// How a condition list enters the transformer.
template <class C>
constexpr fuse::method fusion_of() {
  if constexpr (std::is_void_v<typename C::fuser>) return fuse::method::none;
  else return C::fuser::how;
}
// Condition positions the transformer sees in front of the tokens: LC with fuse::prepend, else 0.
template <class C>
constexpr int prepended_positions() {
  if constexpr (std::is_void_v<typename C::fuser>) return 0;
  else return C::fuser::how == fuse::method::prepend ? C::positions : 0;
}
template <class C>
constexpr bool masks_condition_padding() {
  if constexpr (std::is_void_v<typename C::fuser>) return false;
  else return C::fuser::mask_padding;
}

}  // namespace etude
