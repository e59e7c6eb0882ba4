// Chat templates. GGUF files carry the model's Jinja template; trellis does not embed a
// Jinja interpreter, so it recognises the ChatML family (SmolLM2, Qwen, ...) and renders it
// directly, taking the default system message out of the template text itself.
#include <string>

#include "trellis/core/error.hpp"
#include "trellis/runtime/tokenizer/tokenizer.hpp"

namespace trellis::runtime {
namespace {

// The default system block a ChatML template inserts when messages[0] is not a system
// message, e.g. "{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system
// ...<|im_end|>\n' }}{% endif %}". Empty when the template has none.
std::string default_system_block(const std::string& tpl) {
  const std::string cond = "messages[0]['role'] != 'system'";
  auto c = tpl.find(cond);
  if (c == std::string::npos) return {};
  auto open = tpl.find("{{", c);
  auto endif = tpl.find("{% endif %}", c);
  if (open == std::string::npos || endif == std::string::npos || open > endif) return {};
  auto q1 = tpl.find('\'', open);
  auto close = tpl.find("}}", open);
  if (q1 == std::string::npos || close == std::string::npos) return {};
  auto q2 = tpl.rfind('\'', close);
  if (q2 == std::string::npos || q2 <= q1) return {};
  std::string lit = tpl.substr(q1 + 1, q2 - q1 - 1);
  // Jinja string escapes that occur in templates.
  std::string out;
  for (std::size_t i = 0; i < lit.size(); ++i) {
    if (lit[i] == '\\' && i + 1 < lit.size()) {
      char n = lit[++i];
      out += n == 'n' ? '\n' : n;
    } else {
      out += lit[i];
    }
  }
  return out;
}

// The template text with spaces removed, double quotes as single quotes and real newlines
// as the two characters \n, so that the ChatML pieces can be matched however a template
// spells them.
std::string normalise(const std::string& tpl) {
  std::string out;
  for (char c : tpl) {
    if (c == ' ' || c == '\t') continue;
    if (c == '\n') out += "\\n";
    else out += c == '"' ? '\'' : c;
  }
  return out;
}

// Whether the template is the ChatML form rendered below: every message as
// <|im_start|>{role}\n{content}<|im_end|>\n, and (when one is asked for) the assistant
// header as generation prompt. Templates with extra logic (tools, role checks that raise,
// reasoning blocks) are not.
bool is_plain_chatml(const std::string& tpl, bool generation_prompt) {
  const std::string n = normalise(tpl);
  const bool message = n.find("'<|im_start|>'+message['role']+'\\n'+message['content']+'<|im_end|>'") !=
                           std::string::npos ||
                       n.find("'<|im_start|>'+message.role+'\\n'+message.content+'<|im_end|>'") != std::string::npos;
  const bool header = !generation_prompt || n.find("<|im_start|>assistant\\n") != std::string::npos;
  const bool extra = n.find("tools") != std::string::npos || n.find("raise_exception") != std::string::npos ||
                     n.find("<think>") != std::string::npos;
  return message && header && !extra;
}

}  // namespace

std::string Tokenizer::apply_chat_template(const std::vector<ChatMessage>& messages,
                                           bool add_generation_prompt) const {
  const std::string& tpl = chat_template();
  if (tpl.empty()) throw_error(ErrorCode::kUnsupported, "the model has no tokenizer.chat_template");
  if (!is_plain_chatml(tpl, add_generation_prompt))
    throw_error(ErrorCode::kUnsupported,
                "tokenizer.chat_template is not the plain ChatML form trellis renders "
                "(<|im_start|>role\\ncontent<|im_end|>\\n, no tools): '{}{}'",
                tpl.substr(0, 160), tpl.size() > 160 ? "..." : "");
  std::string out;
  if (!messages.empty() && messages[0].role != "system") out += default_system_block(tpl);
  for (const ChatMessage& m : messages) out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
  if (add_generation_prompt) out += "<|im_start|>assistant\n";
  return out;
}

std::vector<std::int32_t> Tokenizer::encode_chat(const std::vector<ChatMessage>& messages,
                                                 bool add_generation_prompt) const {
  for (const ChatMessage& m : messages)
    if (m.role != "system" && m.role != "user" && m.role != "assistant")
      throw_error(ErrorCode::kInvalidArgument, "chat message role '{}' is not system, user or assistant", m.role);
  // Validates the template (kUnsupported for anything but plain ChatML); its default system
  // block is template text, so its markers are parsed as the template means them.
  std::string head;
  if (!messages.empty() && messages[0].role != "system") {
    std::string with = apply_chat_template({messages[0]}, false);
    std::string plain = "<|im_start|>" + messages[0].role + "\n" + messages[0].content + "<|im_end|>\n";
    head = with.substr(0, with.size() - plain.size());
  } else {
    apply_chat_template({}, add_generation_prompt);
  }
  std::vector<std::int32_t> out = encode(head, true, false);
  const auto start = encode("<|im_start|>", true, false), end = encode("<|im_end|>", true, false);
  auto append = [&out](const std::vector<std::int32_t>& ids) { out.insert(out.end(), ids.begin(), ids.end()); };
  for (const ChatMessage& m : messages) {
    append(start);
    append(encode(m.role + "\n" + m.content, false, false));
    append(end);
    append(encode("\n", false, false));
  }
  if (add_generation_prompt) {
    append(start);
    append(encode("assistant\n", false, false));
  }
  return out;
}

}  // namespace trellis::runtime
