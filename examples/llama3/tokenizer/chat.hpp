// Chat prompts: the turns of a conversation rendered in a model's chat format, ready to tokenize
// with special tokens parsed. Three formats, recognised from a GGUF file's tokenizer.chat_template
// (the Jinja text itself is not run): ChatML (SmolLM2, Qwen; with the template's default system
// message when the conversation has none), Llama-3 (header ids) and Llama-2 ([INST] ... [/INST]).
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kvdrive/core/error.hpp"

namespace kvdrive::llama {

enum class ChatFormat { chatml, llama3, llama2 };

struct ChatTurn {
  std::string role;  ///< "system", "user" or "assistant"
  std::string content;
};

struct ChatTemplate {
  ChatFormat format = ChatFormat::chatml;
  std::string default_system;  ///< used when the conversation has no system turn (may be empty)

  /// The format a GGUF chat template describes; an empty or unrecognised template is an error
  /// naming what it looked for.
  static ChatTemplate from_gguf(std::string_view jinja) {
    KVD_EXPECT(!jinja.empty(), "the model has no chat template (tokenizer.chat_template); --chat needs one");
    ChatTemplate t;
    if (jinja.find("<|im_start|>") != std::string_view::npos) {
      t.format = ChatFormat::chatml;
      // A default system turn written literally into the template: '<|im_start|>system\n...<|im_end|>'.
      constexpr std::string_view open = "<|im_start|>system\n";
      if (const auto a = jinja.find(open); a != std::string_view::npos) {
        const auto b = jinja.find("<|im_end|>", a + open.size());
        const std::string_view body = jinja.substr(a + open.size(), b == std::string_view::npos ? 0 : b - a - open.size());
        if (b != std::string_view::npos && body.find_first_of("{}'\"+") == std::string_view::npos) t.default_system = body;
      }
    } else if (jinja.find("<|start_header_id|>") != std::string_view::npos) {
      t.format = ChatFormat::llama3;
    } else if (jinja.find("[INST]") != std::string_view::npos) {
      t.format = ChatFormat::llama2;
    } else {
      fail("unrecognised chat template (looked for ChatML <|im_start|>, Llama-3 <|start_header_id|> and Llama-2 [INST]): {:.120}",
           std::string(jinja));
    }
    return t;
  }

  /// The conversation as text, ending with the assistant's header (generation prompt), followed
  /// by `reply_prefix`: the first words of the reply, which the model continues.
  std::string render(std::vector<ChatTurn> turns, std::string_view reply_prefix = {}) const {
    KVD_EXPECT(!turns.empty(), "chat: no turns");
    for (const ChatTurn& t : turns)
      KVD_EXPECT(t.role == "system" || t.role == "user" || t.role == "assistant", "chat: role '{}' (expected system, user or assistant)", t.role);
    if (turns.front().role != "system" && !default_system.empty()) turns.insert(turns.begin(), {"system", default_system});
    std::string s;
    switch (format) {
      case ChatFormat::chatml:
        for (const ChatTurn& t : turns) s += "<|im_start|>" + t.role + "\n" + t.content + "<|im_end|>\n";
        s += "<|im_start|>assistant\n";
        break;
      case ChatFormat::llama3:
        s += "<|begin_of_text|>";
        for (const ChatTurn& t : turns) s += "<|start_header_id|>" + t.role + "<|end_header_id|>\n\n" + t.content + "<|eot_id|>";
        s += "<|start_header_id|>assistant<|end_header_id|>\n\n";
        break;
      case ChatFormat::llama2: {
        // <s>[INST] <<SYS>>\nsystem\n<</SYS>>\n\nuser [/INST] assistant </s><s>[INST] user [/INST]
        std::string system;
        std::size_t i = 0;
        if (turns[0].role == "system") system = turns[i++].content;
        bool first = true;
        for (; i < turns.size(); ++i) {
          const ChatTurn& t = turns[i];
          if (t.role == "user") {
            s += "<s>[INST] ";
            if (first && !system.empty()) s += "<<SYS>>\n" + system + "\n<</SYS>>\n\n";
            s += t.content + " [/INST]";
            first = false;
          } else if (t.role == "assistant") {
            s += " " + t.content + " </s>";
          } else {
            fail("chat: a Llama-2 conversation has at most one system turn, first");
          }
        }
        if (!reply_prefix.empty()) s += " ";
        break;
      }
    }
    s += reply_prefix;
    return s;
  }
};

}  // namespace kvdrive::llama
